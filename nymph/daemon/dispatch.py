"""Task handling: launch (fetch -> parse -> build -> create), stop, probe; dockyard launches
and their stops are handed to :mod:`nymph.daemon.dockyard_tasks`.

Launches are exactly-once in effect: a Pod already in the watch cache (or reported as already
existing by the API server) is adopted, never re-created. Failures are classified: transient
ones (connection, throttling, conflicts) are retried here with backoff and jitter, then handed
back to the queue as retryable; permanent ones (Invalid, Forbidden, a bad spec) fail the launch
with the API server's message.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from typing import TYPE_CHECKING, Any

from nymph.daemon import dockyard_tasks
from nymph.errors import NymphError, ValidationError
from nymph.kube.applier import ApplyOutcome
from nymph.kube.errors import AlreadyExists, Conflict, Invalid, KubeError
from nymph.launch.render import PodManifest, manifest_sha256, render_pod
from nymph.launch.spec import LaunchSpec
from nymph.launch.state import InstanceState, Reason
from nymph.logs import get_logger

if TYPE_CHECKING:
    from nymph.daemon.core import Daemon

APPLY_ATTEMPTS = 3


class Dispatcher:
    def __init__(self, daemon: Daemon) -> None:
        self.d = daemon
        self.log = get_logger("dispatcher", node=daemon.node)

    # -- launch --------------------------------------------------------------------------------

    async def launch_batch(self, tasks: list[dict[str, Any]]) -> None:
        d = self.d
        ready: list[tuple[dict[str, Any], PodManifest, str]] = []
        for task in tasks:
            prepared = self._prepare(task)
            if prepared is not None:
                ready.append(prepared)
        pending = ready
        for attempt in range(1, APPLY_ATTEMPTS + 1):
            if not pending:
                return
            outcomes = await self._apply([m for _, m, _ in pending])
            retry: list[tuple[dict[str, Any], PodManifest, str]] = []
            for (task, manifest, sha), outcome in zip(pending, outcomes, strict=True):
                err = outcome.error
                if err is None:
                    self._applied(task, manifest, sha, outcome, adopted=False)
                elif isinstance(err, (AlreadyExists, Conflict, Invalid)) and d.pod_in_cache(
                    manifest["metadata"]["namespace"], manifest["metadata"]["name"]
                ):
                    # Another delivery of this launch got there first: adopt it.
                    self._applied(task, manifest, sha, outcome, adopted=True)
                elif err.transient and attempt < APPLY_ATTEMPTS:
                    retry.append((task, manifest, sha))
                else:
                    self._failed(task, manifest, sha, err)
            pending = retry
            if pending:
                delay = 0.5 * 2 ** (attempt - 1)
                await asyncio.sleep(delay + random.uniform(0, delay))

    def _prepare(self, task: dict[str, Any]) -> tuple[dict[str, Any], PodManifest, str] | None:
        d = self.d
        tid = task["taskId"]
        try:
            spec = LaunchSpec.from_json(task.get("spec") or {})
        except ValidationError as exc:
            d.metrics.launches.labels("failed").inc()
            d.audit.append(
                "apply",
                task=tid,
                instance=task.get("instanceId"),
                node=d.node,
                result="failed",
                error=str(exc),
            )
            d.complete(task_id=tid, ok=False, error=f"bad launch spec: {exc}", retryable=False)
            return None
        if spec.namespace not in d.watchers:
            msg = (
                f"this daemon does not serve namespace {spec.namespace!r} (it serves {', '.join(d.watchers)})"
            )
            d.complete(task_id=tid, ok=False, error=msg, retryable=False)
            return None
        existing = d.pod_in_cache(spec.namespace, spec.instance_id)
        manifest = render_pod(spec, node=d.node, workdir_root=str(d.s.work.root))
        sha = manifest_sha256(manifest)
        if existing is not None:
            from nymph.daemon.core import pod_node

            if pod_node(existing) in (None, d.node):
                # A redelivery after an apply whose answer was lost: the Pod may be waiting for
                # its hostPath, so make sure the workdir exists (idempotent).
                with contextlib.suppress(NymphError, OSError):
                    d.workdirs.create(spec.instance_id)
            self._applied(
                task,
                manifest,
                sha,
                ApplyOutcome(spec.namespace, spec.instance_id, obj=existing),
                adopted=True,
            )
            return None
        if d.stopping.is_set():
            return None
        try:
            d.workdirs.create(spec.instance_id)
        except (NymphError, OSError) as exc:
            self._failed(task, manifest, sha, KubeError(f"workdir: {exc}"))
            return None
        return task, manifest, sha

    async def _apply(self, manifests: list[PodManifest]) -> list[ApplyOutcome]:
        d = self.d
        assert d.applier is not None
        t0 = time.monotonic()
        try:
            return await d.applier.apply([dict(m) for m in manifests])
        except KubeError as exc:
            return [
                ApplyOutcome(m["metadata"]["namespace"], m["metadata"]["name"], error=exc) for m in manifests
            ]
        finally:
            d.metrics.apply_seconds.labels(d.applier.name).observe(time.monotonic() - t0)
            d.metrics.apply_batch.observe(len(manifests))

    def _applied(
        self, task: dict[str, Any], manifest: PodManifest, sha: str, outcome: ApplyOutcome, *, adopted: bool
    ) -> None:
        d = self.d
        name = manifest["metadata"]["name"]
        ns = manifest["metadata"]["namespace"]
        action = "adopt" if adopted else "apply"
        d.metrics.launches.labels("adopted" if adopted else "applied").inc()
        d.audit.append(
            action,
            task=task["taskId"],
            instance=name,
            namespace=ns,
            node=d.node,
            requester=task.get("requester"),
            manifest_sha256=sha,
            result="ok",
        )
        from nymph.daemon.core import Track

        track = d.tracks.setdefault(name, Track(namespace=ns))
        if track.last is None:
            # The watch reports the real phase as soon as it sees the Pod; say "starting" now so
            # the queue leaves "queued" even if the watch is a moment behind.
            d._report(
                name,
                track,
                InstanceState.STARTING.value,
                None,
                "Pod applied" if not adopted else "Pod adopted",
            )
        d.complete(
            task_id=task["taskId"], ok=True, result={"pod": name, "adopted": adopted, "manifestSha256": sha}
        )
        self.log.info("launch applied" if not adopted else "launch adopted", instance=name, namespace=ns)

    def _failed(self, task: dict[str, Any], manifest: PodManifest, sha: str, err: KubeError) -> None:
        d = self.d
        name = manifest["metadata"]["name"]
        d.metrics.launches.labels("failed").inc()
        message = f"{err.__class__.__name__}: {err.message if hasattr(err, 'message') else err}"[:2000]
        d.audit.append(
            "apply",
            task=task["taskId"],
            instance=name,
            namespace=manifest["metadata"]["namespace"],
            node=d.node,
            requester=task.get("requester"),
            manifest_sha256=sha,
            result="failed",
            error=message,
        )
        if not err.transient:
            # A transient failure (a timeout, say) may hide an apply the server accepted: keep
            # the workdir for the Pod that might exist; the redelivery adopts it.
            with contextlib.suppress(NymphError, OSError):
                d.workdirs.remove(name)
        d.complete(task_id=task["taskId"], ok=False, error=message, retryable=err.transient)
        self.log.warning("launch failed", instance=name, error=message, retryable=err.transient)

    # -- stop, probe and dockyard --------------------------------------------------------------

    async def other(self, task: dict[str, Any]) -> None:
        kind = task.get("kind")
        if kind == "stop" and dockyard_tasks.is_dockyard_stop(task):
            await dockyard_tasks.stop(self.d, task)
        elif kind == "stop":
            await self.stop(task)
        elif kind == "dockyard":
            await dockyard_tasks.launch(self.d, task)
        elif kind == "probe":
            await self.probe(task)
        else:
            self.d.complete(
                task_id=task["taskId"], ok=False, error=f"unknown task kind {kind!r}", retryable=False
            )

    async def stop(self, task: dict[str, Any]) -> None:
        d = self.d
        assert d.applier is not None
        from nymph.daemon.core import Track

        name = str(task.get("instanceId"))
        ns = str(task.get("kubeNamespace") or "default")
        grace = task.get("gracePeriodSeconds", d.s.kube.delete_grace_seconds)
        track = d.tracks.setdefault(name, Track(namespace=ns))
        track.stop_requested = True
        already_stopped = track.last is not None and track.last[0] == InstanceState.STOPPED.value
        try:
            deleted = await d.applier.delete_pod(namespace=ns, name=name, grace_seconds=grace)
        except KubeError as exc:
            d.metrics.stops.labels("failed").inc()
            d.audit.append(
                "delete",
                task=task["taskId"],
                instance=name,
                namespace=ns,
                node=d.node,
                result="failed",
                error=str(exc),
            )
            d.complete(
                task_id=task["taskId"], ok=False, error=f"delete failed: {exc}", retryable=exc.transient
            )
            return
        d.audit.append(
            "delete",
            task=task["taskId"],
            instance=name,
            namespace=ns,
            node=d.node,
            requester=task.get("requester"),
            result="deleted" if deleted else "already-gone",
        )
        d.metrics.stops.labels("deleted" if deleted else "already-gone").inc()
        if not already_stopped:
            if deleted:
                d._report(name, track, InstanceState.STOPPING.value, Reason.STOPPED.value, "stop requested")
            else:
                d._report(
                    name,
                    track,
                    InstanceState.STOPPED.value,
                    Reason.STOPPED.value,
                    "stopped on request (no Pod was left)",
                )
        if not deleted:
            d.workdirs.remove(name)
            d.tracks.pop(name, None)
        cached = d.pod_in_cache(ns, name)
        if deleted and cached is not None and not d.mine(cached):
            d.tracks.pop(name, None)  # another node's Pod: its own daemon follows it
        d.complete(task_id=task["taskId"], ok=True, result={"deleted": deleted})

    async def probe(self, task: dict[str, Any]) -> None:
        """``nymph providers test``: prove RBAC and a server-side dry-run apply."""
        d = self.d
        assert d.applier is not None
        checks: list[dict[str, Any]] = [
            {"name": "daemon reachable", "ok": True, "detail": f"{d.s.daemon_id} on {d.node}"}
        ]
        ok = True
        try:
            spec = LaunchSpec.from_json(task.get("spec") or {})
            manifest = render_pod(spec, node=d.node, workdir_root=str(d.s.work.root))
            ns = spec.namespace
        except ValidationError as exc:
            d.complete(task_id=task["taskId"], ok=False, error=f"bad probe spec: {exc}", retryable=False)
            return
        checks.append(
            {"name": f"namespace {ns} served", "ok": ns in d.watchers, "detail": ", ".join(d.watchers)}
        )
        ok = ok and ns in d.watchers
        can_i = getattr(d.applier, "can_i", None)
        if can_i is not None:
            for verb in ("create", "get", "list", "watch", "delete"):
                allowed = bool(await can_i(verb=verb, resource="pods", namespace=ns))
                checks.append(
                    {
                        "name": f"RBAC: {verb} pods",
                        "ok": allowed,
                        "detail": "allowed" if allowed else "denied",
                    }
                )
                ok = ok and allowed
        (outcome,) = await d.applier.apply([dict(manifest)], dry_run=True)
        checks.append(
            {
                "name": "dry-run apply",
                "ok": outcome.ok,
                "detail": "accepted by the API server" if outcome.ok else str(outcome.error),
            }
        )
        ok = ok and outcome.ok
        d.audit.append(
            "probe", task=task["taskId"], namespace=ns, node=d.node, result="ok" if ok else "failed"
        )
        d.complete(
            task_id=task["taskId"],
            ok=ok,
            error=None if ok else "; ".join(c["name"] for c in checks if not c["ok"]),
            retryable=False,
            result={"checks": checks},
        )
