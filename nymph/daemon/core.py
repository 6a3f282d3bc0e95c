"""The daemon: claimer -> dispatcher -> watcher -> outbox (reporter) -> reaper.

Every loop is a named, guarded asyncio task. Signals only set a flag; shutdown stops claiming,
lets in-flight applies finish within a grace period, hands unstarted leases back, flushes the
outbox and exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client as kclient

from nymph.client import (
    QueueAuthError,
    QueueBadRequest,
    QueueClient,
    QueueConflict,
    QueueError,
    QueueNotFound,
    safe_url,
)
from nymph.daemon.aiotasks import cancel_all, guarded
from nymph.daemon.audit import AuditLog
from nymph.daemon.dispatch import Dispatcher
from nymph.daemon.metrics import Metrics
from nymph.daemon.outbox import DropItem, Outbox
from nymph.daemon.settings import DaemonSettings
from nymph.daemon.workdirs import Workdirs
from nymph.kube.api import ApiApplier, make_api_client
from nymph.kube.applier import Applier
from nymph.kube.kubectl import Kubectl
from nymph.kube.watch import PodWatcher
from nymph.launch.names import LABEL_MANAGED
from nymph.launch.render import HOSTNAME_LABEL
from nymph.launch.state import InstanceState, Reason, pod_reason, pod_state
from nymph.logs import get_logger


@dataclass
class Track:
    """What the daemon knows of one of its instances."""

    namespace: str
    last: tuple[str, str | None] | None = None  # (state, reason) last reported
    stop_requested: bool = False
    finished_at: float | None = None
    reaping: bool = False
    gone: bool = False


def pod_node(pod: Mapping[str, Any]) -> str | None:
    """The node a nymph Pod is pinned to (its hostname affinity), else where it was bound."""
    spec = pod.get("spec") or {}
    try:
        terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ]
        for term in terms:
            for expr in term.get("matchExpressions") or []:
                if expr.get("key") == HOSTNAME_LABEL and expr.get("operator") == "In" and expr.get("values"):
                    return str(expr["values"][0])
    except (KeyError, TypeError):
        pass
    node = spec.get("nodeName")
    return str(node) if node else None


class Daemon:
    def __init__(self, settings: DaemonSettings, *, metrics: Metrics | None = None) -> None:
        self.s = settings
        self.node = settings.node
        self.metrics = metrics or Metrics()
        self.log = get_logger("daemon", node=self.node, daemon=settings.daemon_id)
        self.stopping = asyncio.Event()
        self.stopped = asyncio.Event()
        self.tracks: dict[str, Track] = {}
        self.held: dict[str, dict[str, Any]] = {}  # taskId -> task, leases we renew
        self.started: set[str] = set()  # taskIds whose work has begun
        # taskIds whose completion is queued in the outbox: their lease is renewed until the
        # queue has it, so a slow outbox never lets the task be handed out again.
        self.completing: set[str] = set()
        self.local: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.slot_freed = asyncio.Event()
        self.inflight = 0
        self.last_progress = time.monotonic()
        self.queue_ok = False
        self.reconciled = asyncio.Event()
        self.watchers: dict[str, PodWatcher] = {}
        self.tasks: list[asyncio.Task[None]] = []
        self.work_tasks: set[asyncio.Task[None]] = set()
        self.workdirs = Workdirs(
            root=settings.work.root, mode=settings.work.dir_mode, owner=settings.work.owner
        )
        self.audit = AuditLog(settings.audit_path)
        self.outbox = Outbox(settings.state_dir, memory_max=settings.outbox_memory_max)
        self.client: QueueClient | None = None
        self.api: kclient.ApiClient | None = None
        self.applier: Applier | None = None
        self.dispatcher: Dispatcher | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    def request_stop(self) -> None:
        self.stopping.set()

    async def run(self) -> int:
        s = self.s
        self.client = QueueClient(base_url=s.queue.url, token=s.queue.token, timeout=30.0)
        self.api = await make_api_client(kubeconfig=s.kube.kubeconfig, context=s.kube.context)
        self.applier = (
            ApiApplier(self.api)
            if s.kube.apply_with == "api"
            else Kubectl(kubeconfig=s.kube.kubeconfig, context=s.kube.context)
        )
        self.dispatcher = Dispatcher(self)
        self.workdirs.base.mkdir(parents=True, exist_ok=True)
        from nymph.daemon.health import start_health_server

        runner = await start_health_server(self, s.listen)
        self.log.info(
            "daemon starting",
            queue=safe_url(s.queue.url),
            namespaces=list(s.kube.namespaces),
            apply_with=s.kube.apply_with,
        )
        self.tasks.append(guarded("outbox", lambda: self.outbox.run(self._send)))
        for ns in s.kube.namespaces:
            w = PodWatcher(
                api=self.api,
                namespace=ns,
                label_selector=f"{LABEL_MANAGED}=true",
                on_event=self._on_pod_event,
                on_restart=self._watch_restart_counter(ns),
            )
            self.watchers[ns] = w
            self.tasks.append(guarded(f"watch:{ns}", w.run))
        self.tasks.append(guarded("reconcile", self._reconcile, restart=True))
        self.tasks.append(guarded("claimer", self._claim_loop))
        self.tasks.append(guarded("dispatcher", self._dispatch_loop))
        self.tasks.append(guarded("renewer", self._renew_loop))
        self.tasks.append(guarded("reaper", self._reap_loop))
        try:
            await self.stopping.wait()
            await self._shutdown()
        finally:
            await cancel_all(self.tasks)
            await runner.cleanup()
            await self.client.close()
            await self.api.close()
            self.stopped.set()
        self.log.info("daemon stopped")
        return 0

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

    def _settled(self, task_id: str) -> None:
        self.completing.discard(task_id)
        self.started.discard(task_id)
        self.held.pop(task_id, None)

    async def _release(self, task_ids: list[str]) -> None:
        if not task_ids or self.client is None:
            return
        try:
            released = await self.client.release(daemon_id=self.s.daemon_id, task_ids=task_ids)
        except QueueError as exc:
            self.log.warning("could not hand leases back; they will lapse", error=str(exc)[:200])
            return
        for tid in released:
            self.held.pop(tid, None)
            self.audit.append("release", task=tid, node=self.node, result="released")

    def _watch_restart_counter(self, namespace: str) -> Callable[[str], None]:
        def count(why: str) -> None:
            self.metrics.watch_restarts.labels(namespace, why).inc()

        return count

    async def _shutdown(self) -> None:
        s = self.s
        self.log.info("shutting down: no new claims; finishing in-flight work", inflight=self.inflight)
        for t in self.tasks:
            if t.get_name() == "claimer":
                t.cancel()
        while not self.local.empty():
            self.local.get_nowait()
        await self._release([tid for tid in self.held if tid not in self.started])
        if self.work_tasks:
            _, pending = await asyncio.wait(self.work_tasks, timeout=s.shutdown_grace_seconds)
            for p in pending:
                p.cancel()
            if pending:
                await asyncio.wait(pending, timeout=5)
        # Whatever we hold and will not complete (not started, skipped because we are stopping,
        # or cut off by the grace period) goes back now rather than when its lease lapses.
        await self._release([tid for tid in self.held if tid not in self.completing])
        flushed = await self.outbox.flush(timeout=min(10.0, s.shutdown_grace_seconds))
        if not flushed:
            self.log.warning(
                "queue unreachable at shutdown; unsent reports kept on disk", pending=self.outbox.pending
            )

    # -- queue I/O -----------------------------------------------------------------------------

    async def _send(self, kind: str, batch: list[dict[str, Any]]) -> None:
        assert self.client is not None
        s = self.s
        t0 = time.monotonic()
        try:
            if kind == "report":
                reports = [
                    {k: v for k, v in item.items() if k not in ("kind", "stream", "_line") and v is not None}
                    for item in batch
                ]
                await self.client.report(daemon_id=s.daemon_id, stream=batch[0]["stream"], reports=reports)
            elif kind == "complete":
                item = batch[0]
                try:
                    await self.client.complete(
                        daemon_id=s.daemon_id,
                        task_id=item["taskId"],
                        ok=item["ok"],
                        error=item.get("error"),
                        retryable=bool(item.get("retryable")),
                        result=item.get("result"),
                    )
                except (QueueConflict, QueueNotFound, QueueBadRequest):
                    self._settled(item["taskId"])
                    raise
                self._settled(item["taskId"])
            elif kind == "logs":
                item = batch[0]
                await self.client.upload_logs(
                    daemon_id=s.daemon_id, instance_id=item["instanceId"], logs=item["logs"]
                )
        except (QueueConflict, QueueNotFound, QueueBadRequest) as exc:
            raise DropItem(f"{kind}: {exc}") from exc
        finally:
            self.metrics.queue_seconds.labels(kind).observe(time.monotonic() - t0)
            self.metrics.reports_buffered.set(self.outbox.pending)

    async def _claim_loop(self) -> None:
        assert self.client is not None
        s = self.s
        backoff = 0.5
        # Claim nothing before every watch has listed its Pods: the adopt check needs them, and
        # a daemon that cannot reach the API server should leave the work to others.
        while not self.reconciled.is_set():
            self.last_progress = time.monotonic()
            await asyncio.sleep(0.2)
        while not self.stopping.is_set():
            self.last_progress = time.monotonic()
            free = s.concurrency - self.inflight - self.local.qsize()
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
                tid = task["taskId"]
                self.held[tid] = dict(task)
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
                await self.local.put(dict(task))

    async def _dispatch_loop(self) -> None:
        assert self.dispatcher is not None
        sem = asyncio.Semaphore(self.s.concurrency)
        # Launches must not run before the watch caches are synced (the adopt check uses them).
        await asyncio.gather(*(w.synced.wait() for w in self.watchers.values()))
        while True:
            first = await self.local.get()
            batch = [first]
            while len(batch) < self.s.batch_max and not self.local.empty():
                batch.append(self.local.get_nowait())
            for t in batch:
                self.started.add(t["taskId"])
            self.inflight += len(batch)
            self.metrics.inflight.set(self.inflight)
            launches = [t for t in batch if t.get("kind") == "launch"]
            others = [t for t in batch if t.get("kind") != "launch"]
            groups: list[list[dict[str, Any]]] = ([launches] if launches else []) + [[t] for t in others]
            for group in groups:
                await sem.acquire()
                job = asyncio.create_task(self._run_group(group, sem), name=f"work:{group[0]['taskId']}")
                self.work_tasks.add(job)
                job.add_done_callback(self.work_tasks.discard)

    async def _run_group(self, group: list[dict[str, Any]], sem: asyncio.Semaphore) -> None:
        assert self.dispatcher is not None
        try:
            if group[0].get("kind") == "launch":
                await self.dispatcher.launch_batch(group)
            else:
                await self.dispatcher.other(group[0])
        except Exception:
            self.log.exception("task handling crashed", tasks=[t["taskId"] for t in group])
            for t in group:
                if t["taskId"] not in self.completing:
                    self.complete(
                        task_id=t["taskId"], ok=False, error="internal error in the daemon", retryable=True
                    )
        finally:
            sem.release()
            self.inflight -= len(group)
            self.metrics.inflight.set(self.inflight)
            self.slot_freed.set()

    async def _renew_loop(self) -> None:
        assert self.client is not None
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

    # -- watch -> reports ----------------------------------------------------------------------

    def mine(self, pod: Mapping[str, Any]) -> bool:
        return self.node is None or pod_node(pod) in (None, self.node)

    async def _on_pod_event(self, kind: str, pod: dict[str, Any]) -> None:
        if not self.mine(pod):
            return
        name = pod["metadata"]["name"]
        ns = pod["metadata"].get("namespace") or "default"
        track = self.tracks.get(name)
        if track is None:
            track = self.tracks[name] = Track(namespace=ns)
        if kind == "DELETED":
            track.gone = True
            if track.reaping:
                self.tracks.pop(name, None)
                return
            if track.stop_requested:
                self._report(
                    name, track, InstanceState.STOPPED.value, Reason.STOPPED.value, "stopped on request"
                )
            elif track.last is None or track.last[0] != InstanceState.STOPPED.value:
                self._report(
                    name,
                    track,
                    InstanceState.STOPPED.value,
                    Reason.DELETED.value,
                    "the Pod was deleted outside nymph",
                )
            with contextlib.suppress(Exception):
                self.workdirs.remove(name)
            self.tracks.pop(name, None)
            return
        state = pod_state(pod)
        reason, message = pod_reason(pod)
        if state is InstanceState.STOPPED and track.finished_at is None:
            track.finished_at = time.monotonic()
        if state is InstanceState.STOPPING and track.last and track.last[0] == InstanceState.STOPPED.value:
            return  # reaping or a late stop of a finished Pod: it is already stopped
        self._report(name, track, state.value, reason.value if reason else None, message)

    def _report(self, name: str, track: Track, state: str, reason: str | None, message: str | None) -> None:
        if track.last == (state, reason):
            return
        if track.last is not None and track.last[0] == InstanceState.STOPPED.value:
            return  # stopped is final
        track.last = (state, reason)
        self.outbox.report(instance_id=name, state=state, reason=reason, message=message, node=self.node)
        self.metrics.reports_buffered.set(self.outbox.pending)

    def pod_in_cache(self, namespace: str, name: str) -> dict[str, Any] | None:
        w = self.watchers.get(namespace)
        return w.cache.get(name) if w else None

    # -- restart safety ------------------------------------------------------------------------

    async def _reconcile(self) -> None:
        """Adopt our Pods (the watch list reported them) and stop instances whose Pod is gone."""
        assert self.client is not None
        await asyncio.gather(*(w.synced.wait() for w in self.watchers.values()))
        for w in self.watchers.values():
            for name, pod in list(w.cache.items()):
                if self.mine(pod):
                    self.audit.append(
                        "adopt",
                        instance=name,
                        node=self.node,
                        result="adopted-on-start",
                        namespace=w.namespace,
                    )
        if not self.node:
            self.reconciled.set()
            return
        backoff = 1.0
        while True:
            try:
                active = await self.client.active(node=self.node)
                break
            except QueueError as exc:
                self.log.warning("cannot reconcile with the queue yet", error=str(exc)[:200])
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 15)
        for item in active:
            iid = item["instanceId"]
            ns = item.get("kubeNamespace") or "default"
            if ns not in self.watchers or self.pod_in_cache(ns, iid) is not None:
                continue
            if any(t.get("instanceId") == iid for t in self.held.values()):
                continue
            track = self.tracks.setdefault(iid, Track(namespace=ns))
            self._report(
                iid,
                track,
                InstanceState.STOPPED.value,
                Reason.DELETED.value,
                "no Pod found when the daemon started",
            )
            self.tracks.pop(iid, None)
        self.reconciled.set()
        self.log.info("reconciled with the queue", active=len(active))

    # -- reaper --------------------------------------------------------------------------------

    async def _reap_loop(self) -> None:
        assert self.applier is not None
        w = self.s.work
        interval = max(0.5, min(w.reap_after_seconds / 4, 30.0))
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for name, track in list(self.tracks.items()):
                if (
                    track.finished_at is None
                    or track.reaping
                    or now - track.finished_at < w.reap_after_seconds
                ):
                    continue
                track.reaping = True
                await self._reap(name, track)

    async def _reap(self, name: str, track: Track) -> None:
        assert self.applier is not None
        w = self.s.work
        try:
            text = await self.applier.pod_logs(
                namespace=track.namespace, name=name, limit_bytes=w.log_limit_bytes
            )
        except Exception as exc:
            text = f"(logs unavailable: {str(exc)[:200]})"
        self.outbox.logs(instance_id=name, text=text)
        result = "reaped"
        try:
            await self.applier.delete_pod(namespace=track.namespace, name=name, grace_seconds=0)
            self.metrics.reaped.labels("pod").inc()
        except Exception as exc:
            result = f"pod delete failed: {str(exc)[:200]}"
            track.reaping = False
            track.finished_at = time.monotonic()
        if self.workdirs.remove(name):
            self.metrics.reaped.labels("workdir").inc()
        self.audit.append("reap", instance=name, node=self.node, namespace=track.namespace, result=result)
