"""Leases: claim tasks by long-poll, renew what we hold, hand back what we will not do.

The claimer owns the daemon's lease book: the tasks held (renewed every third of a lease), the
ones whose work has begun, the ones whose completion waits in the outbox (renewed until the
queue has it, so a slow outbox never lets a task be handed out again) and the local queue the
runner takes work from. Capacity is the concurrency minus the work in flight and waiting, plus
a small prefetch (half the concurrency): the next tasks are claimed while the current ones are
applied, so a slot that frees starts its next task at once instead of after a claim's round trip.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

from nymph.client import QueueAuthError, QueueClient, QueueError
from nymph.daemon.audit import AuditLog, AuditWriteError
from nymph.daemon.diskhealth import DiskHealth
from nymph.daemon.metrics import Metrics
from nymph.daemon.outbox import Outbox
from nymph.daemon.settings import DaemonSettings
from nymph.daemon.tasks.validate import BadTask, check_task, usable_task_id
from nymph.logs import get_logger
from nymph.protocol import TaskJSON, TaskKind

_KINDS = frozenset(k.value for k in TaskKind)


#: An empty claim answer faster than this did not hold the long-poll.
EMPTY_FAST_SECONDS = 1.0
#: The pause after such an answer, doubling up to the maximum while they keep coming.
EMPTY_PAUSE_MIN = 0.1
EMPTY_PAUSE_MAX = 5.0
#: How often a daemon that cannot reach the API server looks again before it claims.
KUBE_WAIT_SECONDS = 1.0


class Claimer:
    def __init__(
        self,
        *,
        settings: DaemonSettings,
        client: QueueClient,
        outbox: Outbox,
        audit: AuditLog,
        metrics: Metrics,
        disk: DiskHealth | None = None,
        node_offer: Callable[[], dict[str, Any] | None] | None = None,
        offer_ready: Callable[[], Awaitable[None]] | None = None,
        kube_ok: Callable[[], bool] | None = None,
    ) -> None:
        self.s = settings
        self.disk = disk or DiskHealth()
        #: What this daemon's node offers (labels, taints, allocatable), sent with each claim.
        self.node_offer = node_offer
        self.offer_ready = offer_ready
        #: Whether the API server is reachable (the Pod watches are connected); no claims while not.
        self.kube_ok = kube_ok
        self.node = settings.node
        self.client = client
        self.outbox = outbox
        self.audit = audit
        self.metrics = metrics
        self.log = get_logger("claimer", node=self.node, daemon=settings.daemon_id)
        self.held: dict[str, TaskJSON] = {}  # taskId -> task, leases we renew
        self.started: set[str] = set()  # taskIds whose work has begun
        self.completing: set[str] = set()  # taskIds whose completion is in the outbox
        self.abandoned: list[str] = []  # taskIds to hand back: their claim or completion was not saved
        self.local: asyncio.Queue[TaskJSON] = asyncio.Queue()
        self.slot_freed = asyncio.Event()  # the claim loop's wake-up
        self.work_done = asyncio.Event()  # the runner's
        #: Tasks claimed ahead of a free slot (held, renewed, waiting in ``local``).
        self.prefetch = max(1, settings.in_flight // 2)
        self.inflight = 0
        self.last_progress = time.monotonic()
        self.queue_ok = False

    # -- capacity -----------------------------------------------------------------------------

    def capacity(self) -> int:
        return self.s.in_flight + self.prefetch - self.inflight - self.local.qsize()

    async def wait_slot(self, concurrency: int) -> int:
        """Wait until fewer than ``concurrency`` tasks run; how many more may start."""
        while self.inflight >= concurrency:
            self.work_done.clear()
            await self.work_done.wait()
        return concurrency - self.inflight

    def begin(self, batch: list[TaskJSON]) -> None:
        """The runner took ``batch`` off the local queue."""
        for t in batch:
            self.started.add(t["taskId"])
        self.inflight += len(batch)
        self.metrics.inflight.set(self.inflight)

    def end(self, count: int) -> None:
        """``count`` tasks finished running (completed or not)."""
        self.inflight -= count
        self.metrics.inflight.set(self.inflight)
        self.slot_freed.set()
        self.work_done.set()

    # -- completion -----------------------------------------------------------------------------

    def complete(
        self,
        *,
        task_id: str,
        ok: bool,
        error: str | None = None,
        retryable: bool = False,
        result: dict[str, Any] | None = None,
    ) -> None:
        """Queue a task's completion; its lease keeps being renewed until the queue has it.

        A completion the outbox cannot save (the root cannot be written) is not renewed for
        ever: the task is handed back, and the queue gives it out again."""
        self.completing.add(task_id)
        try:
            self.outbox.complete(task_id=task_id, ok=ok, error=error, retryable=retryable, result=result)
        except OSError as exc:
            self.disk.failed("outbox", exc)
            self.log.error("could not save a completion; handing the task back", task=task_id)
            self.abandon(task_id)

    def abandon(self, task_id: str) -> None:
        """Stop renewing ``task_id`` and hand it back to the queue soon."""
        self.completing.discard(task_id)
        self.started.discard(task_id)
        if self.held.pop(task_id, None) is not None:
            self.abandoned.append(task_id)

    def settled(self, task_id: str) -> None:
        """The queue has the completion (or refused it for good)."""
        self.completing.discard(task_id)
        self.started.discard(task_id)
        self.held.pop(task_id, None)

    # -- release --------------------------------------------------------------------------------

    def drop_waiting(self) -> None:
        """Empty the local queue (shutdown: nothing more starts)."""
        while not self.local.empty():
            self.local.get_nowait()

    def held_instances(self) -> set[str]:
        """The instance ids of the tasks held (their workdirs are in use)."""
        return {iid for t in self.held.values() if isinstance(iid := t.get("instanceId"), str)}

    def unstarted(self) -> list[str]:
        return [tid for tid in self.held if tid not in self.started]

    def uncompleted(self) -> list[str]:
        return [tid for tid in self.held if tid not in self.completing]

    async def release(self, task_ids: list[str]) -> None:
        if not task_ids:
            return
        try:
            released = await self.client.release(daemon_id=self.s.daemon_id, task_ids=task_ids)
        except QueueError as exc:
            self.log.warning("could not hand leases back; they will lapse", error=str(exc)[:200])
            return
        for tid in released:
            self.held.pop(tid, None)
            try:
                self.audit.append("release", task=tid, node=self.node, result="released")
            except AuditWriteError as exc:
                self.disk.failed("audit log", exc)

    async def release_abandoned(self) -> None:
        ids, self.abandoned = self.abandoned, []
        await self.release(ids)

    # -- loops --------------------------------------------------------------------------------

    async def claim_loop(self, *, reconciled: asyncio.Event, stopping: asyncio.Event) -> None:
        s = self.s
        backoff = 0.5
        empty_pause = EMPTY_PAUSE_MIN
        # Claim nothing before every watch has listed its Pods: the adopt check needs them, and
        # a daemon that cannot reach the API server should leave the work to others.
        while not reconciled.is_set():
            self.last_progress = time.monotonic()
            await asyncio.sleep(0.2)
        if self.offer_ready is not None:
            await self.offer_ready()
        while not stopping.is_set():
            self.last_progress = time.monotonic()
            await self.release_abandoned()
            if not self.disk.ok:
                # Nothing we claim could be audited or given a workdir: claim nothing until a
                # write test succeeds (the disk health loop runs it every few seconds).
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.disk.wait_writable(), s.queue.poll_wait)
                continue
            if self.kube_ok is not None and not self.kube_ok():
                # Nothing claimed now could be applied: leave the work to daemons that can (what
                # was handed back in the outage is released above, at no cost of an attempt).
                await asyncio.sleep(KUBE_WAIT_SECONDS)
                continue
            free = self.capacity()
            if free <= 0:
                self.slot_freed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.slot_freed.wait(), s.queue.poll_wait)
                continue
            t0 = time.monotonic()
            try:
                tasks = await self.client.claim(
                    daemon_id=s.daemon_id,
                    node=self.node or "",
                    namespaces=list(s.kube.namespaces),
                    capacity=free,
                    wait=s.queue.poll_wait,
                    lease_seconds=s.queue.lease_seconds,
                    node_info=self.node_offer() if self.node_offer is not None else None,
                )
            except QueueAuthError as exc:
                self.queue_ok = False
                self.metrics.claims.labels("auth-error").inc()
                self.log.error(
                    "the queue refused our token; check --token / NYMPH_TOKEN (role daemon)",
                    detail=exc.detail,
                )
                await asyncio.sleep(min(backoff * 4, 30))
                backoff = min(backoff * 2, 15)
                continue
            except QueueError as exc:
                self.queue_ok = False
                self.metrics.claims.labels("error").inc()
                self.log.warning("claim failed; retrying", error=str(exc)[:300])
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 15)
                continue
            backoff = 0.5
            self.queue_ok = True
            self.metrics.claims.labels("ok").inc()
            if tasks:
                self.metrics.queue_seconds.labels("claim").observe(time.monotonic() - t0)
                for task in tasks:
                    if self._claimed(task):
                        await self.local.put(task)
                await self.release_abandoned()
            if any(self._runnable(t) for t in tasks):
                empty_pause = EMPTY_PAUSE_MIN
            elif time.monotonic() - t0 < min(EMPTY_FAST_SECONDS, s.queue.poll_wait / 2):
                # A long-poll answered at once with nothing this daemon can run (a queue shutting
                # down, one that does not hold the poll, or one sending only tasks that do not
                # check out): wait before asking again, longer each time, so it is no tight loop.
                await asyncio.sleep(empty_pause)
                empty_pause = min(empty_pause * 2, EMPTY_PAUSE_MAX)
            else:
                empty_pause = EMPTY_PAUSE_MIN

    def _runnable(self, task: TaskJSON) -> bool:
        """Whether every field of ``task`` checks out (the runner refuses the others)."""
        try:
            check_task(task, served=self.s.kube.namespaces)
        except BadTask:
            return False
        return True

    def _claimed(self, task: TaskJSON) -> bool:
        """Audit the claim, then hold the task; False when it is not to be run.

        A task is held (its lease renewed) only once its claim is in the audit log. When the
        append fails the task is handed back and claiming pauses until the root can be written.
        """
        tid = usable_task_id(task)
        if tid is None:
            # Nothing safe to key, complete or release it by: its lease lapses.
            self.log.error("the queue sent a task without a usable taskId; ignored")
            return False
        kind, iid, requester, attempt = (task.get(k) for k in ("kind", "instanceId", "requester", "attempt"))
        # Recorded as sent, cut short; the runner checks every field before anything acts on it.
        self.metrics.tasks.labels(kind if kind in _KINDS else "invalid").inc()
        try:
            self.audit.append(
                "claim",
                task=tid,
                kind=kind[:64] if isinstance(kind, str) else None,
                instance=iid[:64] if isinstance(iid, str) else None,
                node=self.node,
                requester=requester[:512] if isinstance(requester, str) else None,
                attempt=attempt if isinstance(attempt, int) else None,
            )
        except AuditWriteError as exc:
            self.disk.failed("audit log", exc)
            self.abandoned.append(tid)
            return False
        self.held[tid] = task
        return True

    async def renew_loop(self) -> None:
        s = self.s
        interval = max(1.0, s.queue.lease_seconds / 3)
        while True:
            await asyncio.sleep(interval)
            ids = list(self.held)
            if not ids:
                continue
            try:
                t0 = time.monotonic()
                answer = await self.client.renew(
                    daemon_id=s.daemon_id, task_ids=ids, lease_seconds=s.queue.lease_seconds
                )
                self.metrics.queue_seconds.labels("renew").observe(time.monotonic() - t0)
            except QueueError as exc:
                self.log.warning("lease renewal failed; will retry", error=str(exc)[:200])
                continue
            for tid in answer.get("lost", []):
                self.log.warning("lease lost", task=tid)
                self.held.pop(tid, None)
