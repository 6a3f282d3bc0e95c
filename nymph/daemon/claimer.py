"""Leases: claim tasks by long-poll, renew what we hold, hand back what we will not do.

The claimer owns the daemon's lease book: the tasks held (renewed every third of a lease), the
ones whose work has begun, the ones whose completion waits in the outbox (renewed until the
queue has it, so a slow outbox never lets a task be handed out again) and the local queue the
runner takes work from. Capacity is the concurrency minus the work in flight and waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

from nymph.client import QueueAuthError, QueueClient, QueueError
from nymph.daemon.audit import AuditLog
from nymph.daemon.metrics import Metrics
from nymph.daemon.outbox import Outbox
from nymph.daemon.settings import DaemonSettings
from nymph.logs import get_logger
from nymph.protocol import TaskJSON


class Claimer:
    def __init__(
        self,
        *,
        settings: DaemonSettings,
        client: QueueClient,
        outbox: Outbox,
        audit: AuditLog,
        metrics: Metrics,
        node_offer: Callable[[], dict[str, Any] | None] | None = None,
        offer_ready: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.s = settings
        #: What this daemon's node offers (labels, taints, allocatable), sent with each claim.
        self.node_offer = node_offer
        self.offer_ready = offer_ready
        self.node = settings.node
        self.client = client
        self.outbox = outbox
        self.audit = audit
        self.metrics = metrics
        self.log = get_logger("claimer", node=self.node, daemon=settings.daemon_id)
        self.held: dict[str, TaskJSON] = {}  # taskId -> task, leases we renew
        self.started: set[str] = set()  # taskIds whose work has begun
        self.completing: set[str] = set()  # taskIds whose completion is in the outbox
        self.local: asyncio.Queue[TaskJSON] = asyncio.Queue()
        self.slot_freed = asyncio.Event()
        self.inflight = 0
        self.last_progress = time.monotonic()
        self.queue_ok = False

    # -- capacity -----------------------------------------------------------------------------

    def capacity(self) -> int:
        return self.s.concurrency - self.inflight - self.local.qsize()

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
        """Queue a task's completion; its lease keeps being renewed until the queue has it."""
        self.completing.add(task_id)
        self.outbox.complete(task_id=task_id, ok=ok, error=error, retryable=retryable, result=result)

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
            self.audit.append("release", task=tid, node=self.node, result="released")

    # -- loops --------------------------------------------------------------------------------

    async def claim_loop(self, *, reconciled: asyncio.Event, stopping: asyncio.Event) -> None:
        s = self.s
        backoff = 0.5
        # Claim nothing before every watch has listed its Pods: the adopt check needs them, and
        # a daemon that cannot reach the API server should leave the work to others.
        while not reconciled.is_set():
            self.last_progress = time.monotonic()
            await asyncio.sleep(0.2)
        if self.offer_ready is not None:
            await self.offer_ready()
        while not stopping.is_set():
            self.last_progress = time.monotonic()
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
            if not tasks:
                continue
            self.metrics.queue_seconds.labels("claim").observe(time.monotonic() - t0)
            for task in tasks:
                self._claimed(task)
                await self.local.put(task)

    def _claimed(self, task: TaskJSON) -> None:
        tid = task["taskId"]
        self.held[tid] = task
        self.metrics.tasks.labels(task.get("kind", "?")).inc()
        self.audit.append(
            "claim",
            task=tid,
            kind=task.get("kind"),
            instance=task.get("instanceId"),
            node=self.node,
            requester=task.get("requester"),
            attempt=task.get("attempt"),
        )

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
