"""Claims: take tasks by long-poll, renew what we hold, hand back what we will not do.

The claimer runs the claim and the renew loops. A claimed task is audited, held in the
:class:`~nymph.daemon.leases.LeaseLedger` (whose leases the renew loop keeps, every third of a
lease) and put on the :class:`~nymph.daemon.workqueue.WorkQueue`, whose capacity says how many
tasks the next claim may ask for; the runner takes them from there.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from nymph.client import QueueAuthError, QueueClient, QueueError
from nymph.daemon.audit import AuditLog, AuditWriteError
from nymph.daemon.diskhealth import DiskHealth
from nymph.daemon.leases import LeaseLedger
from nymph.daemon.metrics import Metrics
from nymph.daemon.settings import DaemonSettings
from nymph.daemon.tasks.validate import CheckedTask, intake, usable_task_id
from nymph.daemon.workqueue import WorkQueue
from nymph.logsetup import get_logger
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
        leases: LeaseLedger,
        work: WorkQueue,
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
        self.leases = leases
        self.work = work
        self.audit = audit
        self.metrics = metrics
        self.log = get_logger("claimer", node=self.node, daemon=settings.daemon_id)
        self.last_progress = time.monotonic()
        self.queue_ok = False

    # -- release --------------------------------------------------------------------------------

    async def release(self, task_ids: list[str], *, timeout: float | None = None) -> None:
        """Hand ``task_ids`` back (a queue that does not answer within ``timeout`` seconds is
        given up on: their leases lapse)."""
        if not task_ids:
            return
        await self._released(self.client.release(daemon_id=self.s.daemon_id, task_ids=task_ids), timeout)

    async def release_all(self, *, timeout: float) -> None:
        """Hand back every lease the queue says this daemon holds: at the end of a shutdown,
        once everything it completed was sent, what remains is work it will not do (a claim
        answered while it stopped holds tasks it never saw)."""
        await self._released(self.client.release_all(daemon_id=self.s.daemon_id), timeout)

    async def _released(self, call: Coroutine[Any, Any, list[str]], timeout: float | None) -> None:
        if timeout is not None and timeout <= 0:
            call.close()  # never sent
            self.log.warning("no time left to hand leases back; they will lapse")
            return
        try:
            released = await asyncio.wait_for(call, timeout)
        except (QueueError, TimeoutError) as exc:
            why = str(exc)[:200] or f"no answer in {timeout:g}s"
            self.log.warning("could not hand leases back; they will lapse", error=why)
            return
        for tid in released:
            self.leases.dropped(tid)
            try:
                self.audit.append("release", task=tid, node=self.node, result="released")
            except AuditWriteError as exc:
                self.disk.failed("audit log", exc)

    async def release_abandoned(self) -> None:
        await self.release(self.leases.take_abandoned())

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
            free = self.work.capacity()
            if free <= 0:
                await self.work.wait_capacity(s.queue.poll_wait)
                continue
            # Until a claim has been answered (at start, after an error) the claim is not held:
            # an idle queue would answer a long-poll only when it times out, and the daemon is
            # not ready (its Pod not Ready, a rolling update stalled) before the queue answered.
            hold = s.queue.poll_wait if self.queue_ok else 0.0
            t0 = time.monotonic()
            try:
                tasks = await self.client.claim(
                    daemon_id=s.daemon_id,
                    node=self.node or "",
                    namespaces=list(s.kube.namespaces),
                    capacity=free,
                    wait=hold,
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
            # Each task is checked once, here; the runner refuses what does not check out.
            checked = [intake(t, served=s.kube.namespaces) for t in tasks]
            if tasks:
                self.metrics.queue_seconds.labels("claim").observe(time.monotonic() - t0)
                for task, item in zip(tasks, checked, strict=True):
                    if self._claimed(task) and item is not None:
                        await self.work.put(item)
                await self.release_abandoned()
            if any(isinstance(c, CheckedTask) for c in checked):
                empty_pause = EMPTY_PAUSE_MIN
            elif hold > 0 and time.monotonic() - t0 < min(EMPTY_FAST_SECONDS, hold / 2):
                # A long-poll answered at once with nothing this daemon can run (a queue shutting
                # down, one that does not hold the poll, or one sending only tasks that do not
                # check out): wait before asking again, longer each time, so it is no tight loop.
                await asyncio.sleep(empty_pause)
                empty_pause = min(empty_pause * 2, EMPTY_PAUSE_MAX)
            else:
                empty_pause = EMPTY_PAUSE_MIN

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
        spec = task.get("spec")
        # A retry's launch names the instance it retries (the queue's retry policy made it).
        retry_of = spec.get("retryOf") if isinstance(spec, dict) else None
        # Recorded as sent, cut short; the runner refuses a task that did not check out.
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
                retry_of=retry_of[:64] if isinstance(retry_of, str) else None,
            )
        except AuditWriteError as exc:
            self.disk.failed("audit log", exc)
            self.leases.not_held(tid)
            return False
        self.leases.hold(tid, task)
        return True

    async def renew_loop(self) -> None:
        s = self.s
        interval = max(1.0, s.queue.lease_seconds / 3)
        while True:
            await asyncio.sleep(interval)
            ids = self.leases.held_ids()
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
                self.leases.dropped(tid)
