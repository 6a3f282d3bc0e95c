"""The daemon: builds the parts and runs them as named, guarded loops.

claimer (claims into the lease ledger) -> work queue -> runner (handlers by task kind) -> Pod
watch -> tracker (reports) -> outbox -> sender (queue); the reaper removes finished Pods. Signals only set a flag; shutdown
stops claiming, lets in-flight work finish within a grace period, hands unstarted leases back,
flushes the outbox and exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from kubernetes_asyncio import client as kclient

from nymph.client import DaemonIdentity, QueueClient, safe_url
from nymph.daemon.aiotasks import cancel_all, guarded
from nymph.daemon.audit import AuditLog, AuditWriteError
from nymph.daemon.claimer import Claimer
from nymph.daemon.diskhealth import DiskHealth
from nymph.daemon.health import HealthView, start_health_server
from nymph.daemon.leases import LeaseLedger
from nymph.daemon.logfollow import LogFollowers
from nymph.daemon.metrics import Metrics
from nymph.daemon.nodeinfo import NodeInfo
from nymph.daemon.nodelabels import label_node_pods
from nymph.daemon.outbox import Outbox
from nymph.daemon.podreaper import Reaper
from nymph.daemon.pullwatch import PullWatch
from nymph.daemon.rayjobends import RayJobEnds
from nymph.daemon.reconcile import reconcile
from nymph.daemon.results import ResultUploads
from nymph.daemon.rootlock import RootLock
from nymph.daemon.runner import HandlerRegistry, Runner
from nymph.daemon.sender import QueueSender
from nymph.daemon.settings import DaemonSettings
from nymph.daemon.stopbudget import StopBudget
from nymph.daemon.tasks import dockyard, pods
from nymph.daemon.tasks.context import TaskContext
from nymph.daemon.tracker import Tracker
from nymph.daemon.workdirs import Workdirs
from nymph.daemon.workqueue import WorkQueue
from nymph.eventloop import running_loop_name
from nymph.kube.api import ApiApplier, make_api_client
from nymph.kube.applier import Applier
from nymph.kube.kubectl import Kubectl
from nymph.kube.watch import PodWatcher
from nymph.launch.names import node_selector
from nymph.logsetup import get_logger
from nymph.protocol import TaskKind

#: The longest an audit record waits to be made durable when nothing else syncs it first.
AUDIT_SYNC_SECONDS = 1.0
#: How long a kubectl batch may wait to fill while another apply runs.
KUBECTL_LINGER_SECONDS = 0.1


def default_handlers() -> HandlerRegistry:
    """Every task kind the daemon handles, and by what."""
    registry = HandlerRegistry()
    registry.add_batch(TaskKind.LAUNCH, pods.launch)
    registry.add(TaskKind.STOP, pods.stop, stops=TaskKind.LAUNCH)
    registry.add(TaskKind.PROBE, pods.probe)
    registry.add(TaskKind.DOCKYARD, dockyard.launch)
    registry.add(TaskKind.STOP, dockyard.stop, stops=TaskKind.DOCKYARD)
    return registry


def queue_client(settings: DaemonSettings) -> QueueClient:
    """The daemon's queue client. Every call registers as the daemon's whole identity (id, node,
    namespaces): a report replayed from the outbox before the first claim is then not taken for
    another daemon with this id (a replaced Pod keeps its id: node name and pid 1)."""
    s = settings
    identity = DaemonIdentity(daemon_id=s.daemon_id, node=s.node or "", namespaces=tuple(s.kube.namespaces))
    return QueueClient(base_url=s.queue.url, token=s.queue.token, timeout=30.0, daemon=identity)


async def run_locked(settings: DaemonSettings, *, stopping: asyncio.Event) -> int:
    """Run a daemon once it holds its workdir root (see :mod:`nymph.daemon.rootlock`); exit 0
    if ``stopping`` is set while it waits."""
    lock = RootLock(settings.work.root)
    if not await lock.acquire(stopping=stopping):
        return 0
    try:
        return await Daemon(settings, stopping=stopping).run()
    finally:
        lock.release()


class Daemon:
    def __init__(
        self,
        settings: DaemonSettings,
        *,
        metrics: Metrics | None = None,
        handlers: HandlerRegistry | None = None,
        stopping: asyncio.Event | None = None,
    ) -> None:
        self.s = settings
        self.node = settings.node
        self.metrics = metrics or Metrics()
        self.handlers = handlers or default_handlers()
        self.log = get_logger("daemon", node=self.node, daemon=settings.daemon_id)
        self.stopping = stopping or asyncio.Event()
        self.reconciled = asyncio.Event()
        self.loops: list[asyncio.Task[None]] = []
        self.watchers: dict[str, PodWatcher] = {}
        self.workdirs = Workdirs(
            root=settings.work.root, mode=settings.work.dir_mode, owner=settings.work.owner
        )
        # Written at once, made durable in groups: before a batch of tasks acts, before the
        # queue hears of anything, and within AUDIT_SYNC_SECONDS otherwise.
        self.audit = AuditLog(settings.audit_path, grouped=True)
        # The audit log, the outbox and the workdirs all live under the root.
        self.disk = DiskHealth(directories=(settings.work.root, settings.state_dir, self.workdirs.base))
        self.outbox = Outbox(
            settings.state_dir,
            memory_max=settings.outbox_memory_max,
            linger=settings.outbox_linger,
            pace=settings.outbox_pace,
        )
        self.outbox.also_sync = self.audit
        self.tracker = Tracker(
            node=self.node, outbox=self.outbox, metrics=self.metrics, workdirs=self.workdirs, disk=self.disk
        )

    def request_stop(self) -> None:
        self.stopping.set()

    async def _synced(self) -> None:
        await asyncio.gather(*(w.synced.wait() for w in self.watchers.values()))

    async def _forget_marks(self, followers: LogFollowers, uploads: ResultUploads) -> None:
        """Once every watch has listed its Pods: forget the log cursors and results marks of
        Pods that went while the daemon was down (no DELETED reached it for them)."""
        await self._synced()
        live = {name for w in self.watchers.values() for name in w.cache}
        try:
            forgotten = followers.cursors.keep_only(live | set(followers.tasks))
            forgotten += uploads.done.keep_only(live | set(uploads.tasks))
        except OSError as exc:  # a full disk: they are forgotten at a later start
            self.log.warning("cannot forget the marks of gone Pods", error=str(exc)[:200])
            return
        if forgotten:
            self.log.info("forgot the marks of Pods gone while the daemon was down", marks=forgotten)

    def _applier(self, api: kclient.ApiClient) -> tuple[Applier, Kubectl]:
        kube = self.s.kube
        kubectl = Kubectl(
            kubeconfig=kube.kubeconfig,
            context=kube.context,
            cache_dir=str(self.s.state_dir / "kubectl-cache"),
        )
        if kube.apply_with == "api":
            return ApiApplier(api), kubectl
        return kubectl, kubectl

    def _on_pod_event(
        self, followers: LogFollowers, uploads: ResultUploads, pulls: PullWatch
    ) -> Callable[[str, dict[str, Any]], Awaitable[None]]:
        """The watch's callback: the log followers and result uploads first (a finished Pod's
        must exist before the tracker starts the reaper's clock), the image-pull clocks, then
        the tracker."""

        async def on_event(kind: str, pod: dict[str, Any]) -> None:
            await followers.on_pod_event(kind, pod)
            await uploads.on_pod_event(kind, pod)
            await pulls.on_pod_event(kind, pod)
            await self.tracker.on_pod_event(kind, pod)

        return on_event

    def _audit_log_gap(self, name: str, namespace: str) -> None:
        """The node rotated unread lines of ``name`` away: the log carries a marker, and the
        audit log a record (best effort: the marker is already in the log)."""
        with contextlib.suppress(Exception):
            self.audit.append("log-gap", instance=name, node=self.node, namespace=namespace)

    def _watch_restart_counter(self, namespace: str) -> Callable[[str], None]:
        def count(why: str) -> None:
            self.metrics.watch_restarts.labels(namespace, why).inc()

        return count

    async def run(self) -> int:
        s = self.s
        client = queue_client(s)
        api = await make_api_client(kubeconfig=s.kube.kubeconfig, context=s.kube.context)
        applier, kubectl = self._applier(api)
        nodeinfo = NodeInfo(api=api, node=self.node)
        leases = LeaseLedger(outbox=self.outbox, disk=self.disk, node=self.node, daemon_id=s.daemon_id)
        work = WorkQueue(leases=leases, metrics=self.metrics, in_flight=s.in_flight)
        claimer = Claimer(
            settings=s,
            client=client,
            leases=leases,
            work=work,
            audit=self.audit,
            metrics=self.metrics,
            disk=self.disk,
            node_offer=nodeinfo.offer_json,
            offer_ready=nodeinfo.wait_ready,
            kube_ok=self.tracker.connected,
        )
        context = TaskContext(
            applier=applier,
            kubectl=kubectl,
            tracker=self.tracker,
            complete=leases.complete,
            audit=self.audit,
            metrics=self.metrics,
            workdirs=self.workdirs,
            namespaces=tuple(s.kube.namespaces),
            node=self.node,
            daemon_id=s.daemon_id,
            workdir_root=s.work.root,
            delete_grace_seconds=s.kube.delete_grace_seconds,
            stopping=self.stopping,
            disk=self.disk,
            kube_ok=self.tracker.connected,
            hand_back=leases.abandon,
        )
        runner = Runner(
            work=work,
            registry=self.handlers,
            context=context,
            concurrency=s.in_flight,
            batch_max=s.batch_max,
            # kubectl: a run costs little more for a full batch than for one Pod.
            linger=KUBECTL_LINGER_SECONDS if s.kube.apply_with == "kubectl" and s.batch_max > 1 else 0.0,
        )
        followers = LogFollowers(
            api=api,
            outbox=self.outbox,
            tracker=self.tracker,
            state_dir=s.state_dir,
            on_gap=self._audit_log_gap,
        )
        uploads = ResultUploads(
            client=client,
            daemon_id=s.daemon_id,
            tracker=self.tracker,
            workdirs=self.workdirs,
            state_dir=s.state_dir,
        )
        reaper = Reaper(
            settings=s.work,
            node=self.node,
            tracker=self.tracker,
            # A finished Pod's log and delete through the API client the watches use: with
            # kubectl they were two kubectl runs per launch, more than its share of the apply.
            applier=applier if isinstance(applier, ApiApplier) else ApiApplier(api),
            outbox=self.outbox,
            workdirs=self.workdirs,
            audit=self.audit,
            metrics=self.metrics,
            disk=self.disk,
            busy=leases.held_instances,
            logs_settled=lambda name: followers.settled(name) and uploads.settled(name),
            log_shipped=followers.shipped,
        )
        # Pods whose image cannot be pulled are stopped after their image-pull timeout.
        pulls = PullWatch(
            tracker=self.tracker, applier=reaper.applier, audit=self.audit, state_dir=s.state_dir
        )
        sender = QueueSender(
            daemon_id=s.daemon_id, client=client, leases=leases, outbox=self.outbox, metrics=self.metrics
        )
        try:
            self.workdirs.base.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self.disk.failed("workdir root", exc)  # not ready, claiming nothing, until it can be
        health = await start_health_server(
            HealthView(
                stale_after=s.healthz_stale_polls * (s.queue.poll_wait + 10),
                last_progress=lambda: claimer.last_progress,
                queue_ok=lambda: claimer.queue_ok,
                kube_ok=self.tracker.connected,
                reports_buffered=lambda: self.outbox.pending,
                metrics=self.metrics,
                disk_problem=lambda: self.disk.problem,
            ),
            listen=s.listen,
        )
        self.log.info(
            "daemon starting",
            queue=safe_url(s.queue.url),
            namespaces=list(s.kube.namespaces),
            apply_with=s.kube.apply_with,
            event_loop=running_loop_name(),
        )
        self.loops.append(guarded("outbox", lambda: self.outbox.run(sender)))
        self.loops.append(guarded("nodeinfo", nodeinfo.run))
        for ns in s.kube.namespaces:
            w = PodWatcher(
                api=api,
                namespace=ns,
                label_selector=node_selector(self.node),
                on_event=self._on_pod_event(followers, uploads, pulls),
                on_restart=self._watch_restart_counter(ns),
            )
            self.watchers[ns] = w
            self.tracker.follow(w)
            self.loops.append(guarded(f"watch:{ns}", self._labelled_then(api, ns, w.run)))
        self.loops.append(
            guarded(
                "reconcile",
                lambda: reconcile(
                    node=self.node,
                    client=client,
                    tracker=self.tracker,
                    leases=leases,
                    audit=self.audit,
                    synced=self._synced,
                    reconciled=self.reconciled,
                ),
                restart=True,
            )
        )
        self.loops.append(
            guarded("claimer", lambda: claimer.claim_loop(reconciled=self.reconciled, stopping=self.stopping))
        )
        # Launches must not run before the watch caches are synced (the adopt check uses them).
        self.loops.append(guarded("dispatcher", lambda: runner.run(ready=self._synced)))
        self.loops.append(guarded("forget-marks", lambda: self._forget_marks(followers, uploads)))
        self.loops.append(guarded("renewer", claimer.renew_loop))
        self.loops.append(guarded("reaper", reaper.run))
        self.loops.append(guarded("image-pulls", pulls.run))
        ends = RayJobEnds(
            kubectl=kubectl,
            tracker=self.tracker,
            audit=self.audit,
            namespaces=tuple(s.kube.namespaces),
            node=self.node,
        )
        self.loops.append(guarded("rayjob-ends", ends.run))
        self.loops.append(guarded("disk", self.disk.run))
        self.loops.append(guarded("audit-sync", self._sync_audit))
        try:
            await self.stopping.wait()
            await self._shutdown(claimer, work, runner)
        finally:
            await followers.close()
            await uploads.close()
            await cancel_all(self.loops)
            with contextlib.suppress(AuditWriteError):
                self.audit.sync()
            await health.cleanup()
            await client.close()
            await api.close()
        self.log.info("daemon stopped")
        return 0

    def _labelled_then(
        self, api: kclient.ApiClient, namespace: str, watch: Callable[[], Awaitable[None]]
    ) -> Callable[[], Awaitable[None]]:
        """``watch``, after the node's Pods in ``namespace`` that an older daemon rendered got the
        node label the watch selects on (:mod:`nymph.daemon.nodelabels`): their changes then
        reach the watch's first list, before anything reconciles against it."""
        node = self.node

        async def run() -> None:
            if node is not None:
                await label_node_pods(api, namespace=namespace, node=node)
            await watch()

        return run

    async def _sync_audit(self) -> None:
        """Records no batch or send made durable (a reap, a log gap) are within a second."""
        while True:
            await asyncio.sleep(AUDIT_SYNC_SECONDS)
            try:
                await self.audit.synced()
            except AuditWriteError as exc:
                self.disk.failed("audit log", exc)

    async def _shutdown(self, claimer: Claimer, work: WorkQueue, runner: Runner) -> None:
        s = self.s
        self.log.info("shutting down: no new claims; finishing in-flight work", inflight=work.inflight)
        for t in self.loops:
            if t.get_name() == "claimer":
                t.cancel()
        work.drop_waiting()
        # The whole stop fits in --grace and a reserve: a queue that takes connections and does
        # not answer must not keep the daemon past its Pod's grace period (see StopBudget).
        budget = StopBudget(grace=s.shutdown_grace_seconds)
        await claimer.release(claimer.leases.unstarted(), timeout=budget.left())
        await runner.drain(grace=budget.drain())
        # Whatever we hold and will not complete (not started, skipped because we are stopping,
        # or cut off by the grace period), and what was handed back in an outage or not saved,
        # goes back now rather than when its lease lapses.
        rest = [*claimer.leases.uncompleted(), *claimer.leases.take_abandoned()]
        await claimer.release(list(dict.fromkeys(rest)), timeout=budget.left())
        with contextlib.suppress(AuditWriteError):
            await self.audit.synced()
        flushed = await self.outbox.flush(timeout=budget.left(cap=10.0))
        if not flushed:
            self.log.warning(
                "queue unreachable at shutdown; unsent reports kept on disk", pending=self.outbox.pending
            )
            return
        # Everything completed was sent: what the queue still leases to us is work we will not
        # do, among it the tasks of a claim answered while the claimer was being cancelled.
        await claimer.release_all(timeout=budget.left())
