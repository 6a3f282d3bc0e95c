"""A durable, ordered outbox of what the daemon tells the queue.

State reports, task completions and log uploads are appended to ``<state>/outbox.jsonl``
before anything is sent, and sent in order: the reports and completions of an instance in the
order they were made, a log's chunks in theirs (a batch of reports and completions may pass over
log chunks, which go next in sends of their own). An append is written at once (a kill of the
daemon at any moment loses nothing) and fsynced before it is sent: one fsync per batch, off the
event loop, instead of one per item on it. If the queue is unreachable, they wait
(with backoff) and go out in order when it returns; a daemon restart picks up what was not yet
acknowledged. Reports carry ``(stream, seq)`` so the queue applies each exactly once, however
often a batch is re-sent. Memory is bounded: at most ``memory_max`` items and ``memory_bytes``
of log data are held in memory; the rest wait on disk and are read back in order. Log chunks
(:meth:`Outbox.log_chunk`) are throttled at the source: a follower waits in
:meth:`Outbox.wait_log_room` while more than ``log_budget`` bytes of log are unsent, so a job
printing faster than the queue accepts never fills the disk either. Once most of the file was
sent it is rewritten with the unsent lines only.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import random
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any, Unpack

from nymph import fastjson
from nymph.daemon.durable import (
    Appender,
    TornAppend,
    Writer,
    replace_atomically,
    truncate_to,
    write_in_place,
)
from nymph.daemon.outboxitems import (
    Completion,
    DropItem,
    OutboxSyncError,
    Sender,
    Syncable,
    complete_item,
    log_data_size,
    next_batch,
    parse_line,
)
from nymph.errors import NymphError
from nymph.logsetup import get_logger

__all__ = ["DropItem", "Outbox", "OutboxSyncError", "Sender", "Syncable"]

#: Sent lines kept before the file is emptied (a truncate and an ack, both fsynced).
RESET_LINES = 1000
#: The longest wait between two tries while :meth:`Outbox.flush` waits (seconds)
FLUSH_RETRY_SECONDS = 1.0


#: The sends an item's send is paced with, by its kind (reports and completions go together);
#: a kind not here goes in a request of its own (a log tail): pacing it would only delay it.
_FAMILIES = {"report": "report", "complete": "report", "logchunk": "logchunk"}


def _family(kind: str) -> str | None:
    return _FAMILIES.get(kind)


class Outbox:
    def __init__(
        self,
        directory: Path,
        *,
        memory_max: int = 1000,
        batch_max: int = 200,
        batch_bytes: int = 512 * 1024,
        write: Writer | None = None,
        memory_bytes: int = 2 * 1024 * 1024,
        log_budget: int = 4 * 1024 * 1024,
        compact_after: int = 2000,
        compact_bytes: int = 32 * 1024 * 1024,
        linger: float = 0.0,
        pace: float = 0.0,
    ) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.file = self.dir / "outbox.jsonl"
        self.ack_file = self.dir / "outbox.ack"
        #: The outbox file, held open for its appends and syncs.
        self._appender = Appender(self.file)
        self.memory_max = memory_max
        #: How long a send waits for more items to join it, when fewer than ``batch_max`` wait
        #: (seconds): what a busy daemon sends goes in a few requests rather than one per item.
        self.linger = linger
        #: Under load, the sends of one kind (reports with completions, or log chunks) start at
        #: most once per ``pace`` seconds: a send waits until that long after the last one of its
        #: kind started, so a busy daemon makes a few requests a second whatever its launch rate
        #: (each costs the daemon and the queue more CPU than the items it carries). An idle
        #: daemon's send waits only ``linger``; a full batch (see :meth:`_full`: a large log chunk
        #: is one), a flush or a log tail (a request of its own whatever the pace) does not wait.
        self.pace = pace
        self._started: dict[str, float] = {}
        self.memory_bytes = memory_bytes
        self.log_budget = log_budget
        self.compact_after = compact_after
        self.compact_bytes = compact_bytes
        self.file_bytes = 0  # the file's length (sent lines included)
        self.mem_bytes = 0  # log data held in memory
        self.log_bytes = 0  # log data not yet sent (memory and disk)
        self.log_room = asyncio.Event()
        self.log_room.set()
        self.batch_max = batch_max
        #: A report batch stays under this many bytes (as written), well below the queue's
        #: request body limit: a batch refused as too large would be dropped whole.
        self.batch_bytes = batch_bytes
        self._write = write  # a seam for tests injecting a failing write
        self.stream = uuid.uuid4().hex
        self.seq = 0
        self.mem: deque[dict[str, Any]] = deque()
        self.backlog = 0  # items on disk, not in memory
        self.acked = 0  # lines of the file already sent
        self._held_to = 0  # the line after the last item held in memory
        self.unsynced = False  # items appended since the last fsync
        #: Made durable with the outbox before each send (the daemon's audit log: the queue
        #: never learns of work whose record could still be lost).
        self.also_sync: Syncable | None = None
        self.lines = 0  # lines in the file
        self._repair_to: int | None = None  # where a failed append must be cut back to
        self.wake = asyncio.Event()
        #: set by :meth:`flush`: a send waiting out its backoff tries again now, and the waits
        #: between tries stay short while a flush waits (a queue rolled in the same upgrade
        #: that stops this daemon is back long before a backoff of many seconds ends)
        self._hurry = asyncio.Event()
        self.idle = asyncio.Event()
        self.idle.set()
        self.sent_total = 0
        self.last_error = ""
        self.log = get_logger("outbox")
        self._load()

    # -- persistence ---------------------------------------------------------------------------

    def _load(self) -> None:
        if not self.file.exists():
            return
        try:
            self.acked = int(self.ack_file.read_text().strip() or 0)
        except (OSError, ValueError):
            self.acked = 0
        raw = self.file.read_bytes()
        if raw and not raw.endswith(b"\n"):
            # A write cut short by a crash: drop the partial tail so later lines stay whole.
            keep = raw.rfind(b"\n") + 1
            truncate_to(self.file, keep)
            raw = raw[:keep]
        self.file_bytes = len(raw)
        lines = raw.decode("utf-8", errors="replace").split("\n")[:-1]
        self.lines = len(lines)
        if self.acked >= self.lines:
            self._reset()
            return
        for i in range(self.acked, self.lines):
            item = parse_line(lines[i], i)
            if item is None:
                continue
            self.log_bytes += log_data_size(item)
            if self._fits(item):
                self._hold(item)
            else:
                self.backlog += 1
        self._update_room()
        if self.mem or self.backlog:
            self.idle.clear()
            self.log.info("resuming unsent reports", count=len(self.mem) + self.backlog)

    def _reset(self) -> None:
        # A kill between the two steps leaves an empty file and an old ack past its end, which
        # _load treats as "everything sent" and resets again.
        truncate_to(self.file, 0)
        replace_atomically(self.ack_file, b"0")
        self.acked = 0
        self._held_to = 0
        self.lines = 0
        self.file_bytes = 0

    def _append(self, item: dict[str, Any]) -> int:
        """Append one item (fsynced); returns its line index in the file."""
        data = fastjson.dumps(item) + b"\n"
        if self._repair_to is not None:
            truncate_to(self.file, self._repair_to)
            self._repair_to = None
        try:
            self._appender.append(data, write=self._write, sync=False)
            self.unsynced = True
        except TornAppend as exc:
            self._repair_to = exc.keep  # cut the partial line before the next append
            raise
        index = self.lines
        self.lines += 1
        self.file_bytes += len(data)
        item["_bytes"] = len(data)
        return index

    def _taken(self, batch: list[dict[str, Any]]) -> None:
        """Remove a sent batch from memory: the items of :meth:`_next_batch`, in order, the
        first item among them (the rest may lie behind log chunks it passed over)."""
        for item in batch:
            self.mem_bytes -= log_data_size(item)
        if self.mem[len(batch) - 1] is batch[-1]:  # the head of memory: most sends
            for _ in batch:
                self.mem.popleft()
            return
        sent = {id(item) for item in batch}
        self.mem = deque(item for item in self.mem if id(item) not in sent)

    def _ack(self, batch: list[dict[str, Any]]) -> None:
        # Acknowledged up to the first item not sent: one a batch passed over (a log chunk)
        # keeps its line, and those sent after it in the file are sent again after a restart,
        # which the queue ignores (by stream and seq, by task, by chunk offset).
        # With nothing left in memory, everything held was sent (the backlog lies after it).
        self.acked = (
            int(self.mem[0]["_line"]) if self.mem else max(int(batch[-1]["_line"]) + 1, self._held_to)
        )
        self.sent_total += len(batch)
        self.log_bytes -= sum(log_data_size(item) for item in batch)
        self._update_room()
        drained = not self.mem and self.backlog == 0
        big = self.file_bytes >= self.compact_bytes and self.acked * 2 >= self.lines
        if drained and (self.lines >= RESET_LINES or self.file_bytes >= self.compact_bytes):
            self._reset()  # durable: new lines must never sit below an old, larger ack
        elif not drained and (self.acked >= self.compact_after or big):
            self._compact()  # durable too, for the same reason
        else:
            # The ack may lag what was sent (not fsynced): a lost write re-sends, which the
            # queue ignores by (stream, seq) and chunk offset; it never runs ahead of the file
            # since the last (durable) reset or compaction. Each send then costs no fsync
            # beyond its items' own appends.
            # Written in place (one fixed-width write, no temp file and rename: a kill never
            # tears a write of one page; a torn one after a power cut reads as 0 and re-sends).
            write_in_place(self.ack_file, f"{self.acked:020d}\n".encode())
        if drained:
            self.idle.set()
        elif not self.mem and self.backlog:
            self._refill()

    def _compact(self) -> None:
        """Rewrite the file with its unsent lines only (atomically, ack reset with it)."""
        if self._repair_to is not None:
            truncate_to(self.file, self._repair_to)
            self._repair_to = None
        with self.file.open("rb") as fh:
            rest = b"".join(ln for i, ln in enumerate(fh) if i >= self.acked)
        # The ack file first: a kill between the two leaves ack 0 with the old file, so the
        # sent lines are sent again (harmless: reports and chunks are idempotent at the queue).
        replace_atomically(self.ack_file, b"0")
        replace_atomically(self.file, rest)
        self._appender.close()  # the file held is the one replaced
        shift = self.acked
        for item in self.mem:
            item["_line"] = int(item["_line"]) - shift
        self.lines -= shift
        self._held_to = max(0, self._held_to - shift)
        self.acked = 0
        self.file_bytes = len(rest)

    def _refill(self) -> None:
        with self.file.open(encoding="utf-8", errors="replace") as fh:
            for i, ln in enumerate(fh):
                if i < self.acked:
                    continue
                item = parse_line(ln, i)
                if item is None:
                    continue
                if not self._fits(item, refill=True):
                    break
                self._hold(item)
                self.backlog -= 1
        if not self.mem:
            self.backlog = 0  # nothing readable was left

    # -- producers -----------------------------------------------------------------------------

    @property
    def pending(self) -> int:
        return len(self.mem) + self.backlog

    def _fits(self, item: dict[str, Any], *, refill: bool = False) -> bool:
        if self.backlog and not refill:
            return False
        if not self.mem:
            return True  # one item always fits, whatever its size
        return len(self.mem) < self.memory_max and self.mem_bytes + log_data_size(item) <= self.memory_bytes

    def _hold(self, item: dict[str, Any]) -> None:
        self.mem.append(item)
        self._held_to = int(item["_line"]) + 1
        self.mem_bytes += log_data_size(item)

    def _update_room(self) -> None:
        if self.log_bytes < self.log_budget:
            self.log_room.set()
        else:
            self.log_room.clear()

    async def wait_log_room(self) -> None:
        """Return once fewer than ``log_budget`` bytes of log wait to be sent."""
        while self.log_bytes >= self.log_budget:
            self.log_room.clear()
            await self.log_room.wait()

    def reporting(self, instance_id: str) -> bool:
        """Whether a report on ``instance_id`` waits to be sent (or may: some items wait on disk)."""
        return self.backlog > 0 or any(
            i["kind"] == "report" and i.get("instanceId") == instance_id for i in self.mem
        )

    def _put(self, item: dict[str, Any]) -> None:
        item["_line"] = self._append(item)
        if self._fits(item):
            self._hold(item)
        else:
            self.backlog += 1
        self.log_bytes += log_data_size(item)
        self._update_room()
        self.idle.clear()
        self.wake.set()

    def report(
        self,
        *,
        instance_id: str,
        state: str,
        reason: str | None = None,
        message: str | None = None,
        node: str | None = None,
        termination: tuple[int, str, str] | None = None,
    ) -> None:
        self.seq += 1
        ended: dict[str, Any] = {}
        if termination is not None:
            ended = {
                "exitCode": termination[0],
                "terminationReason": termination[1][:200],
                "terminationMessage": termination[2][:4096],
            }
        self._put(
            {
                **ended,
                "kind": "report",
                "stream": self.stream,
                "seq": self.seq,
                "instanceId": instance_id,
                "state": state,
                "reason": reason,
                "message": (message or "")[:2000] or None,
                "node": node,
                "at": dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
            }
        )

    def complete(self, *, instance: str | None = None, **completion: Unpack[Completion]) -> None:
        """A task's completion; ``instance``: its instance id, when known (see ``next_batch``)."""
        self._put(complete_item(completion, instance=instance))

    def logs(self, *, instance_id: str, text: str) -> None:
        self._put({"kind": "logs", "instanceId": instance_id, "logs": text})

    def log_chunk(
        self,
        *,
        instance_id: str,
        offset: int,
        data: bytes,
        cursor: str | None = None,
        final: bool = False,
        note: str | None = None,
    ) -> None:
        """A piece of an instance's log from byte ``offset`` (see :mod:`nymph.launch.logcursor`)."""
        item: dict[str, Any] = {
            "kind": "logchunk",
            "instanceId": instance_id,
            "offset": offset,
            "data": base64.b64encode(data).decode("ascii"),
            "final": final,
        }
        if cursor is not None:
            item["cursor"] = cursor
        if note is not None:
            item["note"] = note[:2000]
        self._put(item)

    # -- the sender loop -----------------------------------------------------------------------

    def _next_batch(self) -> tuple[str, list[dict[str, Any]]]:
        return next_batch(self.mem, max_items=self.batch_max, max_bytes=self.batch_bytes)

    def _full(self, kind: str, batch: list[dict[str, Any]]) -> bool:
        """Whether waiting could not add to ``batch``: it holds ``batch_max`` items or half of
        ``batch_bytes`` (one large log chunk), an item of its kind in memory was left out of it
        (a size limit, another stream, an item between), or items wait on disk (memory is full).
        """
        if self.backlog or len(batch) >= self.batch_max:
            return True
        if 2 * sum(int(item.get("_bytes") or 0) for item in batch) >= self.batch_bytes:
            return True
        family = _family(kind)
        return sum(1 for item in self.mem if _family(str(item["kind"])) == family) > len(batch)

    def _wait(self, now: float, kind: str, batch: list[dict[str, Any]]) -> float:
        """How long the next send waits for more items to join ``batch`` (seconds): ``linger``,
        or until ``pace`` after the last send of its kind started, whichever is later; none
        when it is full (:meth:`_full`). A flush ends the wait (see :meth:`run`)."""
        if self._full(kind, batch):
            return 0.0
        wait = self.linger
        family = _family(kind)
        if self.pace > 0 and family is not None:
            last = self._started.get(family)
            if last is not None:
                wait = max(wait, last + self.pace - now)
        return wait

    async def run(self, send: Sender) -> None:
        backoff = 0.5
        while True:
            if not self.mem:
                if self.backlog:
                    self._refill()
                    continue
                self.wake.clear()
                await self.wake.wait()
                continue
            kind, batch = self._next_batch()
            wait = self._wait(time.monotonic(), kind, batch)
            if wait > 0 and not self._hurry.is_set():
                with contextlib.suppress(TimeoutError):  # a flush ends the wait
                    await asyncio.wait_for(self._hurry.wait(), wait)
                kind, batch = self._next_batch()
            family = _family(kind)
            if family is not None:
                self._started[family] = time.monotonic()
            try:
                await self._sync()
                await send(kind, batch)
            except asyncio.CancelledError:
                raise
            except DropItem as exc:
                self.log.warning("queue refused an item; dropping it", kind=kind, detail=str(exc)[:300])
            except Exception as exc:
                self.last_error = f"{exc.__class__.__name__}: {exc}"[:300]
                self.log.warning(
                    "cannot reach the queue; will retry", pending=self.pending, error=self.last_error
                )
                pause = backoff + random.uniform(0, backoff / 2)
                if self._hurry.is_set():  # a flush waits: try again soon, but no tight loop
                    await asyncio.sleep(min(pause, FLUSH_RETRY_SECONDS))
                else:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._hurry.wait(), pause)
                backoff = min(backoff * 2, 15.0)
                continue
            backoff = 0.5
            self.last_error = ""
            self._taken(batch)
            self._ack(batch)

    async def _sync(self) -> None:
        """fsync the items appended since the last time (and what ``also_sync`` syncs), in a
        thread (the loop runs on)."""
        also = self.also_sync if self.also_sync is not None and self.also_sync.unsynced else None
        if not self.unsynced and also is None:
            return
        unsynced, self.unsynced = self.unsynced, False
        try:
            await asyncio.to_thread(self._sync_files, unsynced, also)
        except (OSError, NymphError) as exc:
            self.unsynced = unsynced
            raise OutboxSyncError(f"cannot fsync the outbox: {exc}") from exc

    def _sync_files(self, unsynced: bool, also: Syncable | None) -> None:
        if also is not None:
            also.sync()
        if unsynced:
            self._appender.fsync()

    async def flush(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until everything was sent; a send waiting out its
        backoff tries again at once, and again every :data:`FLUSH_RETRY_SECONDS` meanwhile."""
        self._hurry.set()
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.idle.wait(), timeout)
        finally:
            self._hurry.clear()
        return self.idle.is_set()
