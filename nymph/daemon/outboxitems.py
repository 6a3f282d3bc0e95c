"""What the outbox holds and who it deals with (pure): the items' shapes, the one definition of
a task's completion, and the seams to the sender and to a file synced with the outbox.

An item is a JSON object with a ``kind`` (``report``, ``complete``, ``logs``, ``logchunk``);
``_line`` (its line in the file) and ``_bytes`` (its length as written) are the outbox's own
bookkeeping, never sent.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, Required, TypedDict, Unpack

Sender = Callable[[str, list[dict[str, Any]]], Awaitable[None]]
#: How many items :func:`next_batch` looks at, in ``max_items``: the log chunks it passes over
#: are bounded by the memory budget, not by a batch.
SCAN_FACTOR = 4


class Completion(TypedDict, total=False):
    """A task's outcome, as a handler gives it: what every ``complete(...)`` takes."""

    task_id: Required[str]
    ok: Required[bool]
    error: str | None  # None when not given
    retryable: bool  # False when not given
    result: dict[str, Any] | None  # None when not given


class Complete(Protocol):
    """Hand a task's outcome to the queue (through the outbox)."""

    def __call__(self, **completion: Unpack[Completion]) -> None: ...


def complete_item(completion: Completion, *, instance: str | None = None) -> dict[str, Any]:
    """The outbox item of a completion; ``instance`` (the task's instance, when known) is kept
    for :func:`next_batch` only, never sent."""
    item = {
        "kind": "complete",
        "taskId": completion["task_id"],
        "ok": completion["ok"],
        "error": completion.get("error"),
        "retryable": completion.get("retryable", False),
        "result": completion.get("result"),
    }
    if instance is not None:
        item["instanceId"] = instance
    return item


def log_data_size(item: dict[str, Any]) -> int:
    """The log data an item carries (what the memory and log budgets count)."""
    data = item.get("data") if item.get("kind") == "logchunk" else None
    return len(data) if isinstance(data, str) else 0


def parse_line(line: str, index: int) -> dict[str, Any] | None:
    """The item on line ``index`` of the file, or None for a line that is not one."""
    try:
        item = json.loads(line)
    except ValueError:
        return None
    if not isinstance(item, dict) or "kind" not in item:
        return None
    item["_line"] = index
    item["_bytes"] = len(line)
    return item


#: Requests a run of reports and completions goes out in at most (their kinds alternating).
MAX_PHASES = 4


class _Phases:
    """Places the reports and completions of a run, in their order, in the requests it goes out
    in (phases: phase ``i`` carries ``kinds[i % 2]``, sent one after the other). An item goes in
    the earliest phase of its kind that keeps its instance's order (with its instance's last
    item when of the same kind, after it when not) and, for a report, its stream's: no earlier
    than the last report placed (the queue ignores a seq at or below one it applied). A
    completion whose instance is not known (from an older daemon's file) goes only before any
    report, and every report after it in a later phase."""

    def __init__(self, first: str) -> None:
        self.kinds = (first, "complete" if first == "report" else "report")
        self.last: dict[str, int] = {}  # instance -> the phase of its last item
        self.report_floor = 0
        self.reported = False

    def _from(self, kind: str, phase: int) -> int:
        """The first phase of ``kind`` at or after ``phase``."""
        return phase if self.kinds[phase % 2] == kind else phase + 1

    def fit(self, item: dict[str, Any]) -> int | None:
        """The phase ``item`` would go in, or None when it needs one past :data:`MAX_PHASES`."""
        kind, instance = str(item["kind"]), item.get("instanceId")
        if kind == "complete" and not isinstance(instance, str):
            return None if self.reported else self._from(kind, 0)
        prev = self.last.get(str(instance))
        if prev is None:
            phase = self._from(kind, 0)
        else:
            phase = self._from(kind, prev if self.kinds[prev % 2] == kind else prev + 1)
        if kind == "report":
            phase = max(phase, self._from(kind, self.report_floor))
        return phase if phase < MAX_PHASES else None

    def place(self, item: dict[str, Any], phase: int) -> None:
        instance = item.get("instanceId")
        if item["kind"] == "report":
            self.reported = True
            self.report_floor = phase
        elif not isinstance(instance, str):
            self.report_floor = max(self.report_floor, phase + 1)
            return
        self.last[str(instance)] = phase


def next_batch(
    items: Sequence[dict[str, Any]], *, max_items: int, max_bytes: int
) -> tuple[str, list[dict[str, Any]]]:
    """The next send from ``items`` (not empty): its kind (its first item's) and the items it
    takes, in their order, the first among them.

    A send is a run of reports of one stream and completions, or a run of log chunks (at most
    ``max_items``, under ``max_bytes`` as written), else the first item alone. A run of log
    chunks is the chunks at the head, in their order (one request). A run of reports and
    completions goes out in at most :data:`MAX_PHASES` requests, reports and completions in
    turn (:func:`sends`), so that the reports and completions of one instance reach the queue
    in the order they were made and a stream's reports in theirs; the item that would need
    one more request ends the run.

    Log chunks are passed over, not taken (they go in sends of their own, in their order): a
    log is a stream of its own, which the queue orders by offset, so a run does not end at
    every launch's log. Any other item ends the run. At most :data:`SCAN_FACTOR` times
    ``max_items`` items are looked at."""
    first = items[0]
    kind = str(first["kind"])
    if kind == "logchunk":
        return kind, _chunk_run(items, max_items=max_items, max_bytes=max_bytes)
    if kind not in ("report", "complete"):
        return kind, [first]
    batch: list[dict[str, Any]] = []
    phases = _Phases(kind)
    stream: object = None
    size = 0
    for looked, item in enumerate(items):
        if len(batch) >= max_items or looked >= max_items * SCAN_FACTOR:
            break
        if item["kind"] == "logchunk":
            continue
        if item["kind"] not in ("report", "complete"):
            break
        if item["kind"] == "report" and stream is not None and item["stream"] != stream:
            break
        phase = phases.fit(item)
        size += int(item.get("_bytes") or 0)
        if phase is None or (batch and size > max_bytes):
            break
        phases.place(item, phase)
        batch.append(item)
        if item["kind"] == "report":
            stream = item["stream"]
    return kind, batch


def sends(batch: Sequence[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """The requests a run of reports and completions from :func:`next_batch` goes out in, in
    order: ``(kind, items)`` per phase that has any."""
    phases = _Phases(str(batch[0]["kind"]))
    groups: list[list[dict[str, Any]]] = [[] for _ in range(MAX_PHASES)]
    for item in batch:
        phase = phases.fit(item)
        if phase is None:
            raise ValueError("not a run of next_batch: an item needs one request too many")
        phases.place(item, phase)
        groups[phase].append(item)
    return [(phases.kinds[i % 2], group) for i, group in enumerate(groups) if group]


def _chunk_run(items: Sequence[dict[str, Any]], *, max_items: int, max_bytes: int) -> list[dict[str, Any]]:
    run: list[dict[str, Any]] = []
    size = 0
    for item in items:
        if item["kind"] != "logchunk" or len(run) >= max_items:
            break
        size += int(item.get("_bytes") or 0)
        if run and size > max_bytes:
            break
        run.append(item)
    return run


class Syncable(Protocol):
    """A file written at once and made durable later (the daemon's audit log)."""

    unsynced: int

    def sync(self) -> int: ...


class OutboxSyncError(OSError):
    """The outbox could not be fsynced: its items are not sent until it can be."""


class DropItem(Exception):
    """Raised by a sender for an item the queue will never accept (e.g. a lost lease)."""
