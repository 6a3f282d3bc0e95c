"""The local work queue between the claimer and the runner, and the slots that bound it.

The claimer puts each claimed task here; the runner takes them off, at most ``concurrency``
running at once. Capacity (what the claimer may ask the queue for) is the concurrency minus the
work in flight and waiting, plus a small prefetch (half the concurrency): the next tasks are
claimed while the current ones are applied, so a slot that frees starts its next task at once
instead of after a claim's round trip.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from nymph.daemon.leases import LeaseLedger
from nymph.daemon.metrics import Metrics
from nymph.daemon.tasks.validate import CheckedTask, Refused

#: A claimed task as the claimer checked it: ready to handle, or to be refused.
Claimed = CheckedTask | Refused


class WorkQueue:
    def __init__(self, *, leases: LeaseLedger, metrics: Metrics, in_flight: int) -> None:
        self.leases = leases
        self.metrics = metrics
        self.in_flight = in_flight
        self.local: asyncio.Queue[Claimed] = asyncio.Queue()
        self.slot_freed = asyncio.Event()  # the claim loop's wake-up
        self.work_done = asyncio.Event()  # the runner's
        #: Tasks claimed ahead of a free slot (held, renewed, waiting here).
        self.prefetch = max(1, in_flight // 2)
        self.inflight = 0

    # -- the claimer's side ---------------------------------------------------------------------

    def capacity(self) -> int:
        return self.in_flight + self.prefetch - self.inflight - self.local.qsize()

    async def wait_capacity(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for a slot to free (call when :meth:`capacity` is 0)."""
        self.slot_freed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.slot_freed.wait(), timeout)

    async def put(self, task: Claimed) -> None:
        await self.local.put(task)

    def drop_waiting(self) -> None:
        """Empty the queue (shutdown: nothing more starts)."""
        while not self.local.empty():
            self.local.get_nowait()

    # -- the runner's side ----------------------------------------------------------------------

    async def get(self) -> Claimed:
        return await self.local.get()

    def take(self, count: int) -> list[Claimed]:
        """Up to ``count`` tasks that wait already (none waited for)."""
        taken: list[Claimed] = []
        while len(taken) < count and not self.local.empty():
            taken.append(self.local.get_nowait())
        return taken

    async def wait_slot(self, concurrency: int) -> int:
        """Wait until fewer than ``concurrency`` tasks run; how many more may start."""
        while self.inflight >= concurrency:
            self.work_done.clear()
            await self.work_done.wait()
        return concurrency - self.inflight

    async def wait_change(self, *, timeout: float, take: bool) -> Claimed | None:
        """Wait up to ``timeout`` seconds for a running task to end or, when ``take``, for a
        task to arrive; the task that arrived (taken off the queue), else None."""
        self.work_done.clear()
        freed = asyncio.ensure_future(self.work_done.wait())
        got: asyncio.Future[Claimed] | None = None
        if take:
            got = asyncio.ensure_future(self.local.get())
        waits: list[asyncio.Future[Any]] = [freed] if got is None else [freed, got]
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            freed.cancel()
            arrived: Claimed | None = None
            if got is not None:
                if got.done() and not got.cancelled():
                    arrived = got.result()
                else:
                    got.cancel()
        return arrived

    def begin(self, batch: list[Claimed]) -> None:
        """The runner took ``batch`` off the queue: their work has begun."""
        self.leases.start([t.task_id for t in batch])
        self.inflight += len(batch)
        self.metrics.inflight.set(self.inflight)

    def end(self, count: int) -> None:
        """``count`` tasks finished running (completed or not)."""
        self.inflight -= count
        self.metrics.inflight.set(self.inflight)
        self.slot_freed.set()
        self.work_done.set()

    def completed(self, task_id: str) -> bool:
        """Whether ``task_id``'s completion is queued already (a crash must not complete it again)."""
        return self.leases.is_completing(task_id)
