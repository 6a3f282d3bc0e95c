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


def next_batch(
    items: Sequence[dict[str, Any]], *, max_items: int, max_bytes: int
) -> tuple[str, list[dict[str, Any]]]:
    """The next send from ``items`` (not empty): the items it takes, in their order, the first
    among them, and its kind.

    A send is a run of reports of one stream and completions, or a run of log chunks (at most
    ``max_items``, under ``max_bytes`` as written), else the first item alone (its kind is that
    item's). A run of log chunks is the chunks at the head, in their order (one request). A run
    of reports and completions goes
    out as two requests, one for its completions and one for its reports; its kind says which
    goes first (``complete`` or ``report``), chosen so the reports and completions of one
    instance still reach the queue in the order they were made: a completion after a report on
    its instance makes the reports go first, a report after a completion on its instance the
    completions, and the item that would need the other order ends the run. A completion whose
    instance is not known (from an older daemon's file) joins only before any report, and
    makes the completions go first.

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
    stream: object = None
    reported: set[object] = set()
    completed: set[object] = set()
    first_sent: str | None = None  # which kind goes first, once an instance needs one
    size = 0
    for looked, item in enumerate(items):
        if len(batch) >= max_items or looked >= max_items * SCAN_FACTOR:
            break
        instance = item.get("instanceId")
        if item["kind"] == "logchunk":
            continue
        if item["kind"] == "report":
            if stream is not None and item["stream"] != stream:
                break
            need = "complete" if instance in completed else None
        elif item["kind"] == "complete":
            if not isinstance(instance, str):
                need = "complete" if not reported else "never"
            else:
                need = "report" if instance in reported else None
        else:
            break
        if need == "never" or (need is not None and first_sent not in (None, need)):
            break
        size += int(item.get("_bytes") or 0)
        if batch and size > max_bytes:
            break
        first_sent = first_sent or need
        batch.append(item)
        if item["kind"] == "report":
            stream = item["stream"]
            reported.add(instance)
        else:
            completed.add(instance)
    return first_sent or kind, batch


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
