"""Launch POSTs that arrive together, written together (PostgreSQL).

On PostgreSQL a launch POST is a write of its own: its catalog read and its rows, two round
trips to the server, each a statement the replica prepares, sends and reads, and the server
parses, runs and commits. When many come at once (a team's sweep, a retry storm, a CI fan-out)
those per-write costs, not the launches, fill the replica's core and the server's.

:class:`LaunchBatcher` takes the launches without an Idempotency-Key that reach the store
together, per namespace, provider and mode, and writes them as one transaction
(:func:`nymph.queue.sql.launches.launch_batch`): one catalog read, and every launch's rows as
one statement with the commit. A batch stays open while the turns of the event loop keep
bringing it launches (a burst's requests are read over a few turns) and is written after the
first turn that brings none, or once it is full: a launch that comes alone waits one turn of
the loop, nothing more. Batches of different keys, and a batch and the launches that arrive
while it is written, are separate writes that run side by side.

Each launch keeps its own answer: a launch refused (its spec, its team's tenancy) is answered
with its error and the others of its batch go on; a catalog error (no such provider or mode)
is every launch's answer; a write that fails for anything else (a conflict met at the commit,
say) is sent again launch by launch, each on its own as before, so a launch never fails for
another's sake. A database lost once the commit was sent leaves every launch of the batch
unknown, and each is told so (a 503), never written twice.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from nymph.protocol import LaunchAccepted
from nymph.queue.errors import ServiceError, Unavailable
from nymph.queue.sql.launches import BatchLaunch, BatchOutcome, WrongPath

log = structlog.get_logger(__name__, component="queue.launchbatch")

#: The most launches written in one batch (one statement's rows: each launch adds about forty
#: parameters, far below PostgreSQL's limit; the replica builds a batch's specs in one go).
MAX_BATCH = 64

#: The name of a batch's task.
BATCH_TASK = "nymph-queue-launch-batch"
#: A launch accepted: its 202 body and its task's spec.
Accepted = tuple[LaunchAccepted, dict[str, Any]]


@dataclass(frozen=True)
class BatchKey:
    """What the launches of one batch share."""

    ns: str
    provider: str
    mode: str


#: Writes a batch (in one transaction): each launch's outcome, in order.
WriteBatch = Callable[[BatchKey, Sequence[BatchLaunch]], Awaitable[list[BatchOutcome]]]
#: Writes one launch alone (its own transaction, as a launch without batches is written).
WriteAlone = Callable[[BatchKey, BatchLaunch], Awaitable[Accepted]]


@dataclass
class _Waiting:
    item: BatchLaunch
    answer: asyncio.Future[Accepted]


class LaunchBatcher:
    """Batches of the launches that reach :meth:`launch` together (see the module doc)."""

    def __init__(self, *, write: WriteBatch, alone: WriteAlone, max_batch: int = MAX_BATCH) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._write = write
        self._alone = alone
        self.max_batch = max_batch
        #: Told the launches of each batch written (the replica's metrics).
        self.written: Callable[[int], None] = lambda launches: None
        #: Launches waiting for their batch to close (a quiet turn, or full), per key.
        self._open: dict[BatchKey, list[_Waiting]] = {}
        #: Batches being written (kept so that none is collected while it runs).
        self._running: set[asyncio.Task[None]] = set()
        #: Batches written, and launches in them (for the metrics and the tests).
        self.batches = 0
        self.launches = 0

    async def launch(self, key: BatchKey, item: BatchLaunch) -> Accepted:
        """Accept ``item`` in the next batch of ``key``: its 202 body and task spec, or its error."""
        loop = asyncio.get_running_loop()
        waiting = _Waiting(item=item, answer=loop.create_future())
        batch = self._open.get(key)
        if batch is None:
            batch = self._open[key] = []
            loop.call_soon(self._close_if_quiet, key, batch, 1)
        batch.append(waiting)
        if len(batch) >= self.max_batch:
            self._close(key, batch)
        return await waiting.answer

    def _close_if_quiet(self, key: BatchKey, batch: list[_Waiting], seen: int) -> None:
        """Close ``batch`` at the end of a turn in which no launch joined it (the launches of a
        burst reach the replica over a few turns, as their requests are read)."""
        if len(batch) > seen and self._open.get(key) is batch:
            asyncio.get_running_loop().call_soon(self._close_if_quiet, key, batch, len(batch))
            return
        self._close(key, batch)

    async def drain(self) -> None:
        """Wait for the batches under way (a stopping queue)."""
        while self._running:
            await asyncio.wait(set(self._running))

    def _close(self, key: BatchKey, batch: list[_Waiting]) -> None:
        """Start writing ``batch`` (once: a quiet turn or the batch's size closes it)."""
        if self._open.get(key) is not batch:
            return
        del self._open[key]
        task = asyncio.get_running_loop().create_task(self._run(key, batch), name=BATCH_TASK)
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _run(self, key: BatchKey, batch: list[_Waiting]) -> None:
        """Write ``batch`` and answer each launch; guarded: every launch is answered whatever
        happens."""
        live = [w for w in batch if not w.answer.done()]  # a caller gone before its write: dropped
        try:
            if live:
                await self._write_batch(key, live)
        except BaseException as exc:  # the task's guard: no launch is left without an answer
            for w in live:
                _answer_error(w, exc if isinstance(exc, Exception) else Unavailable("the queue is stopping"))
            if not isinstance(exc, Exception):
                raise
            log.exception("launch batch failed", namespace=key.ns, provider=key.provider, launches=len(live))

    async def _write_batch(self, key: BatchKey, live: list[_Waiting]) -> None:
        try:
            outcomes = await self._write(key, [w.item for w in live])
        except (ServiceError, WrongPath) as exc:
            # the catalog's answer (or an outcome unknown): every launch's
            for w in live:
                _answer_error(w, exc)
            return
        except Exception as exc:  # each launch is sent again on its own
            if len(live) == 1:
                _answer_error(live[0], exc)
                return
            log.info(
                "launch batch not written; sending its launches one by one",
                error=exc.__class__.__name__,
                launches=len(live),
            )
            await asyncio.gather(*(self._one(key, w) for w in live))
            return
        self.batches += 1
        self.launches += len(live)
        self.written(len(live))
        for w, outcome in zip(live, outcomes, strict=True):
            if isinstance(outcome, ServiceError):
                _answer_error(w, outcome)
            elif not w.answer.done():
                w.answer.set_result(outcome)

    async def _one(self, key: BatchKey, w: _Waiting) -> None:
        try:
            got = await self._alone(key, w.item)
        except Exception as exc:  # it is this launch's answer
            _answer_error(w, exc)
        else:
            if not w.answer.done():
                w.answer.set_result(got)


def _answer_error(w: _Waiting, exc: BaseException) -> None:
    if not w.answer.done():
        w.answer.set_exception(_own(exc))


def _own(exc: BaseException) -> BaseException:
    """A copy of ``exc`` for one waiter: one exception raised in many tasks would share (and
    grow) one traceback. One that cannot be copied is shared."""
    try:
        return copy.copy(exc)
    except Exception:  # an exception whose arguments do not rebuild it
        return exc
