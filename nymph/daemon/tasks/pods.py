"""Pod tasks: launch (spec -> Pod -> apply), stop (delete), probe (RBAC and a dry-run apply).

Launches are exactly-once in effect: a Pod already in the watch cache (or reported as already
existing by the API server) is adopted, never re-created. Failures are classified: transient
ones are retried (:mod:`nymph.daemon.tasks.apply`), then handed back to the queue as
retryable; permanent ones (Invalid, Forbidden, a bad spec) fail the launch with the API
server's message.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from nymph.daemon.tasks.apply import apply_each
from nymph.daemon.tasks.context import TaskContext
from nymph.daemon.tasks.identity import (
    ANNOTATION_LAUNCH,
    annotate,
    is_launch_pod,
    launch_identity,
    pod_identity,
)
from nymph.daemon.tasks.validate import CheckedTask
from nymph.daemon.tracker import Report, pod_node
from nymph.daemon.workdirs import WorkdirWriteError
from nymph.errors import NymphError, ValidationError
from nymph.kube.applier import ApplyOutcome
from nymph.kube.errors import AlreadyExists, Conflict, FieldConflict, Invalid, KubeError
from nymph.launch.render import PodManifest, manifest_sha256, render_pod
from nymph.launch.spec import LaunchSpec
from nymph.launch.state import InstanceState, Reason
from nymph.logsetup import get_logger
from nymph.protocol import TaskJSON

_RBAC_VERBS = ("create", "get", "list", "watch", "delete")


@dataclass(frozen=True)
class _Ready:
    task: TaskJSON
    manifest: PodManifest
    sha: str
    identity: str  # the launch annotation its Pod carries

    @property
    def name(self) -> str:
        return str(self.manifest["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.manifest["metadata"]["namespace"])


def _log(ctx: TaskContext) -> Any:
    return get_logger("pod-tasks", node=ctx.node)


# --- launch ----------------------------------------------------------------------------------------


async def launch(ctx: TaskContext, tasks: list[CheckedTask]) -> None:
    """A batch of ``launch`` tasks: their Pods are applied together.

    Each launch is rendered on its own first: one that cannot be rendered fails alone, with its
    reason. A batch the applier refuses as a whole is applied again one by one
    (:func:`~nymph.daemon.tasks.apply.apply_each`), so one bad Pod costs the others nothing.
    """
    ready = [r for r in (_prepare(ctx, t.task) for t in tasks) if r is not None]

    def adoptable(outcome: ApplyOutcome, r: _Ready) -> bool:
        # Another delivery of this launch got there first: adopt it (only if it is this launch's).
        cached = ctx.tracker.pod_in_cache(r.namespace, r.name)
        return (
            isinstance(outcome.error, (AlreadyExists, Conflict, Invalid))
            and cached is not None
            and is_launch_pod(cached, r.identity)
        )

    def clash(outcome: ApplyOutcome, r: _Ready) -> dict[str, Any] | None:
        cached = ctx.tracker.pod_in_cache(r.namespace, r.name)
        if outcome.error is None or cached is None or is_launch_pod(cached, r.identity):
            return None
        return cached

    def retry(index: int, outcome: ApplyOutcome) -> bool:
        err, r = outcome.error, ready[index]
        return err is not None and err.transient and not adoptable(outcome, r) and clash(outcome, r) is None

    def settle(index: int, outcome: ApplyOutcome) -> None:
        r = ready[index]
        if outcome.error is None:
            _applied(ctx, r, outcome, adopted=False)
        elif adoptable(outcome, r):
            _applied(ctx, r, outcome, adopted=True)
        elif (foreign := clash(outcome, r)) is not None:
            _clash(ctx, r, foreign)
        elif isinstance(outcome.error, FieldConflict):
            _clash(ctx, r, None, detail=outcome.error.message.strip().splitlines()[0])
        else:
            _failed(ctx, r, outcome.error)

    if ready:
        await apply_each(
            applier=ctx.applier,
            manifests=[dict(r.manifest) for r in ready],
            metrics=ctx.metrics,
            retry=retry,
            settle=settle,
        )


class _WorkdirUnwritable(KubeError):
    """The workdir could not be created under a root that cannot be written: worth a retry."""

    transient = True


def _render(ctx: TaskContext, task: TaskJSON) -> _Ready | None:
    """Validate and render one launch alone; refuse it (for good, with the reason) when it cannot."""
    raw = task.get("spec") or {}
    try:
        spec = LaunchSpec.from_json(raw)
        manifest = render_pod(spec, node=ctx.node, workdir_root=str(ctx.workdir_root))
        identity = annotate(manifest, launch_identity(spec))
        # Its hash encodes it as JSON (strictly: UTF-8 text), so a Pod that cannot travel fails
        # here, alone.
        sha = manifest_sha256(manifest)
    except ValidationError as exc:
        ctx.refuse_spec(task, what="launch", error=exc)
        return None
    except (RecursionError, ValueError, TypeError, OverflowError) as exc:
        error = ValidationError("spec", f"cannot be rendered as a Pod ({exc.__class__.__name__})")
        ctx.refuse_spec(task, what="launch", error=error)
        return None
    return _Ready(task, manifest, sha, identity)


def _prepare(ctx: TaskContext, task: TaskJSON) -> _Ready | None:
    ready = _render(ctx, task)
    if ready is None:
        return None
    tid, name, ns = task["taskId"], ready.name, ready.namespace
    unserved = ctx.unserved(ns)
    if unserved:
        ctx.complete(task_id=tid, ok=False, error=unserved, retryable=False)
        return None
    existing = ctx.tracker.pod_in_cache(ns, name)
    if existing is not None:
        if not is_launch_pod(existing, ready.identity):
            _clash(ctx, ready, existing)
            return None
        if pod_node(existing) in (None, ctx.node):
            # A redelivery after an apply whose answer was lost: the Pod may be waiting for
            # its hostPath, so make sure the workdir exists (idempotent).
            with contextlib.suppress(NymphError, OSError):
                ctx.workdirs.create(name)
        _applied(ctx, ready, ApplyOutcome(ns, name, obj=existing), adopted=True)
        return None
    if ctx.stopping.is_set():
        return None
    try:
        ctx.workdirs.create(name)
    except WorkdirWriteError as exc:
        ctx.disk.failed("workdir", exc)
        _failed(ctx, ready, _WorkdirUnwritable(f"workdir: {exc}"))
        return None
    except (NymphError, OSError) as exc:
        _failed(ctx, ready, KubeError(f"workdir: {exc}"))
        return None
    return ready


def _clash(ctx: TaskContext, r: _Ready, foreign: dict[str, Any] | None, *, detail: str = "") -> None:
    """A Pod of this name exists but is not this launch's: fail for good, touch nothing of it.
    ``foreign``: that Pod as the watch saw it; None when only the API server's refusal of the
    apply (another field manager owns its fields, ``detail``) tells it is there."""
    if foreign is None:
        why = f"another field manager owns its fields: {detail}"
    else:
        why = f"{ANNOTATION_LAUNCH} is {'missing' if pod_identity(foreign) is None else 'different'}"
    message = (
        f"Conflict: a Pod named {r.name} already exists in namespace {r.namespace} and was not "
        f"created for this launch ({why}); it is left alone"
    )
    ctx.metrics.launches.labels("failed").inc()
    _audit(ctx, r, "apply", result="conflict", error=message)
    # The workdir of that name is the other Pod's: it stays.
    ctx.complete(task_id=r.task["taskId"], ok=False, error=message, retryable=False)
    _log(ctx).warning("launch refused: name clash with a foreign Pod", instance=r.name, namespace=r.namespace)


def _audit(ctx: TaskContext, r: _Ready, action: str, *, result: str, error: str | None = None) -> None:
    """The audit record of one launch's apply, adopt or refusal (with its manifest's sha256)."""
    extra = {"error": error} if error is not None else {}
    ctx.audit.append(
        action,
        task=r.task["taskId"],
        instance=r.name,
        namespace=r.namespace,
        node=ctx.node,
        requester=r.task.get("requester"),
        manifest_sha256=r.sha,
        result=result,
        **extra,
    )


def _applied(ctx: TaskContext, r: _Ready, outcome: ApplyOutcome, *, adopted: bool) -> None:
    ctx.metrics.launches.labels("adopted" if adopted else "applied").inc()
    _audit(ctx, r, "adopt" if adopted else "apply", result="ok")
    track = ctx.tracker.track(r.name, namespace=r.namespace)
    if track.last is None:
        # The watch reports the real phase as soon as it sees the Pod; say "starting" now so
        # the queue leaves "queued" even if the watch is a moment behind.
        message = "Pod adopted" if adopted else "Pod applied"
        ctx.tracker.report(r.name, track, Report(InstanceState.STARTING, None, message))
    ctx.complete(
        task_id=r.task["taskId"],
        ok=True,
        result={"pod": r.name, "adopted": adopted, "manifestSha256": r.sha},
    )
    _log(ctx).info("launch adopted" if adopted else "launch applied", instance=r.name, namespace=r.namespace)


def _failed(ctx: TaskContext, r: _Ready, err: KubeError) -> None:
    message = f"{err.__class__.__name__}: {err.message if hasattr(err, 'message') else err}"[:2000]
    if ctx.in_outage(err):
        # The API server is down for this daemon: no attempt is lost, the launch goes back to
        # the queue (its workdir stays for the Pod that may exist; a redelivery adopts it).
        _audit(ctx, r, "apply", result="handed-back", error=message)
        ctx.give_back(r.task["taskId"])
        _log(ctx).warning("API server unreachable; launch handed back", instance=r.name)
        return
    ctx.metrics.launches.labels("failed").inc()
    _audit(ctx, r, "apply", result="failed", error=message)
    if not err.transient:
        # A transient failure (a timeout, say) may hide an apply the server accepted: keep
        # the workdir for the Pod that might exist; the redelivery adopts it.
        with contextlib.suppress(NymphError, OSError):
            ctx.workdirs.remove(r.name)
    ctx.complete(task_id=r.task["taskId"], ok=False, error=message, retryable=err.transient)
    _log(ctx).warning("launch failed", instance=r.name, error=message, retryable=err.transient)


# --- stop ------------------------------------------------------------------------------------------


async def stop(ctx: TaskContext, checked: CheckedTask) -> None:
    """A ``stop`` of a Pod instance: delete the Pod; the watch reports ``stopped`` when it is gone."""
    tracker = ctx.tracker
    task = checked.task
    name, ns = checked.instance_id, checked.kube_namespace
    grace = task.get("gracePeriodSeconds", ctx.delete_grace_seconds)
    track = tracker.track(name, namespace=ns)
    track.stop_requested = True
    already_stopped = track.stopped
    try:
        deleted = await ctx.applier.delete_pod(namespace=ns, name=name, grace_seconds=grace)
    except KubeError as exc:
        outage = ctx.in_outage(exc)
        ctx.metrics.stops.labels("handed-back" if outage else "failed").inc()
        ctx.audit.append(
            "delete",
            task=task["taskId"],
            instance=name,
            namespace=ns,
            node=ctx.node,
            result="handed-back" if outage else "failed",
            error=str(exc),
        )
        if outage:
            ctx.give_back(task["taskId"])  # the API server is down here: no attempt is lost
        else:
            ctx.complete(
                task_id=task["taskId"], ok=False, error=f"delete failed: {exc}", retryable=exc.transient
            )
        return
    ctx.audit.append(
        "delete",
        task=task["taskId"],
        instance=name,
        namespace=ns,
        node=ctx.node,
        requester=task.get("requester"),
        result="deleted" if deleted else "already-gone",
    )
    ctx.metrics.stops.labels("deleted" if deleted else "already-gone").inc()
    if not already_stopped:
        if deleted:
            report = Report(InstanceState.STOPPING, Reason.STOPPED, "stop requested")
        else:
            report = Report(InstanceState.STOPPED, Reason.STOPPED, "stopped on request (no Pod was left)")
        tracker.report(name, track, report)
    if not deleted:
        ctx.workdirs.remove(name)
        tracker.forget(name)
    cached = tracker.pod_in_cache(ns, name)
    if deleted and cached is not None and not tracker.mine(cached):
        tracker.forget(name)  # another node's Pod: its own daemon follows it
    ctx.complete(task_id=task["taskId"], ok=True, result={"deleted": deleted})


# --- probe -----------------------------------------------------------------------------------------


async def probe(ctx: TaskContext, checked: CheckedTask) -> None:
    """``nymph providers test``: prove RBAC and a server-side dry-run apply."""
    task = checked.task
    checks: list[dict[str, Any]] = [
        {"name": "daemon reachable", "ok": True, "detail": f"{ctx.daemon_id} on {ctx.node}"}
    ]
    try:
        spec = LaunchSpec.from_json(task.get("spec") or {})
        manifest = render_pod(spec, node=ctx.node, workdir_root=str(ctx.workdir_root))
        ns = spec.namespace
    except ValidationError as exc:
        ctx.complete(task_id=task["taskId"], ok=False, error=f"bad probe spec: {exc}", retryable=False)
        return
    served = ctx.unserved(ns) is None
    checks.append({"name": f"namespace {ns} served", "ok": served, "detail": ", ".join(ctx.namespaces)})
    ok = served
    for verb in _RBAC_VERBS:
        allowed = await ctx.applier.can_i(verb=verb, resource="pods", namespace=ns)
        checks.append(
            {"name": f"RBAC: {verb} pods", "ok": allowed, "detail": "allowed" if allowed else "denied"}
        )
        ok = ok and allowed
    (outcome,) = await ctx.applier.apply([dict(manifest)], dry_run=True)
    checks.append(
        {
            "name": "dry-run apply",
            "ok": outcome.ok,
            "detail": "accepted by the API server" if outcome.ok else str(outcome.error),
        }
    )
    ok = ok and outcome.ok
    ctx.audit.append(
        "probe", task=task["taskId"], namespace=ns, node=ctx.node, result="ok" if ok else "failed"
    )
    ctx.complete(
        task_id=task["taskId"],
        ok=ok,
        error=None if ok else "; ".join(c["name"] for c in checks if not c["ok"]),
        retryable=False,
        result={"checks": checks},
    )
