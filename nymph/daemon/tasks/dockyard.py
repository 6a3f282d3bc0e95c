"""Dockyard tasks on the daemon: a recipe + infra becomes objects applied in order; a stop
deletes them again.

fetch -> render (pure: :func:`nymph.dockyard.render.task.dockyard_task_manifests`) -> label
(every object gets ``nymph.io/launch=<instanceId>``) -> ownership (one ``kubectl get``) -> apply
(I/O: one ``kubectl apply --server-side`` of every object, in apply order) -> report.

* Ownership (:mod:`nymph.dockyard.ownership`): an object is applied only when it does
  not exist or already carries this launch's label. A name taken by any other object (an
  administrator's NetworkPolicy named like the launch's sandbox) fails the launch for good with
  a message naming it, and nothing is applied or deleted but this launch's own objects of
  earlier attempts. Rollbacks and stops delete with a selector on the label, so the API server
  itself refuses to delete an object that is not the launch's. (Between the check and the apply
  an object created under the same name in that instant would still be applied over.)

* Exactly-once in effect: the render is deterministic and server-side apply under one field
  manager is idempotent, so a redelivered task re-applies the same objects, never duplicates.
* There is no Pod to watch: the instance is ``starting`` while the objects are applied and
  ``running`` once all are (KubeRay and the Deployment controller take it from there). The
  completion result lists the objects. The instance keeps no node: its objects are not pinned
  to this one, so any daemon serving the namespace may stop it.
* Failures are classified like launches: transient ones (connection, throttling, conflicts)
  are retried here with backoff, then handed back to the queue as retryable; a permanent one
  (Invalid, Forbidden, a bad spec) fails the launch with the API server's message, after
  deleting what this attempt applied, so a failed launch leaves nothing running. So does the
  last retryable attempt (``attempt`` reaching the task's ``maxAttempts``, else the queue's
  default :data:`QUEUE_MAX_ATTEMPTS`): everything rendered is deleted, what earlier attempts
  applied included.
* A stop task carries the dockyard spec again (``{"dockyard": spec}``): the same objects are
  rendered and deleted in reverse order; an object already gone is fine, one that is not the
  launch's is left alone (and named in the report).
* The Pod policy (:mod:`nymph.launch.podpolicy`) is checked here too: the queue refuses such
  a spec before it is queued, and a spec that reached the daemon some other way (an older
  queue, a row written by hand) is refused for good, never applied.
* Always kubectl, whatever ``--apply-with`` says: the API applier handles only Pods.
* Applies are retried as :func:`nymph.daemon.tasks.apply.apply_all` says; reports go through
  the tracker, unpinned (no node).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from nymph.daemon.tasks.apply import apply_all
from nymph.daemon.tasks.context import TaskContext
from nymph.daemon.tasks.dockyard_objects import Deleted, DockyardObject, Live, delete_owned, live_objects
from nymph.daemon.tasks.validate import CheckedTask
from nymph.daemon.tracker import Report
from nymph.dockyard.errors import DockyardConfigError
from nymph.dockyard.ownership import LAUNCH_LABEL, Ownership, mark, ownership
from nymph.errors import ValidationError
from nymph.kube.applier import ApplyOutcome, object_key
from nymph.kube.errors import KubeError
from nymph.launch.durations import parse_duration
from nymph.launch.names import is_instance_id
from nymph.launch.podpolicy import PodPolicyError, check_manifests
from nymph.launch.state import InstanceState, Reason
from nymph.logsetup import get_logger

#: the queue's default number of attempts of a task (``nymph.queue.models.RetrySettings``),
#: for a task that does not say its own ``maxAttempts``
QUEUE_MAX_ATTEMPTS = 5

__all__ = ["QUEUE_MAX_ATTEMPTS", "DockyardObject", "last_attempt", "launch", "render", "stop"]


# --- pure --------------------------------------------------------------------------------------


def render(spec: object, *, namespace: str) -> list[dict[str, Any]]:
    """The manifests of a dockyard task spec for ``namespace``, in apply order.

    Raises :class:`DockyardConfigError` for a spec of the wrong shape, one dispatched to
    another namespace than the task's, or one the renderer refuses. A ``maxRuntime`` in the
    spec (seconds, the queue's runtime cap) becomes a RayJob's ``activeDeadlineSeconds``.
    """
    if not isinstance(spec, Mapping):
        raise DockyardConfigError("the task carries no dockyard spec", source="task")
    recipe = spec.get("recipe")
    infra = spec.get("infra") or {}
    overrides = spec.get("overrides") or []
    if not isinstance(recipe, Mapping):
        raise DockyardConfigError("expected a mapping", path="recipe", source="task")
    if not isinstance(infra, Mapping):
        raise DockyardConfigError("expected a mapping", path="infra", source="task")
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise DockyardConfigError("expected a list of strings", path="overrides", source="task")
    if spec.get("namespace") != namespace:
        raise DockyardConfigError(
            f"the spec is for namespace {spec.get('namespace')!r} but the task for {namespace!r}",
            path="namespace",
            source="task",
        )
    try:
        raw_runtime = spec.get("maxRuntime")
        max_runtime = None if raw_runtime is None else parse_duration(raw_runtime, "maxRuntime")
    except ValidationError as exc:
        raise DockyardConfigError(exc.message, path="maxRuntime", source="task") from None
    # imported here: the render path loads OmegaConf and pydantic, which a daemon that only
    # runs Pods never needs
    from nymph.dockyard.render.task import dockyard_task_manifests

    return dockyard_task_manifests(
        recipe=recipe, infra=infra, overrides=overrides, namespace=namespace, max_runtime=max_runtime
    )


def last_attempt(task: Mapping[str, Any]) -> bool:
    """Whether a retryable failure of this attempt ends the launch (the queue will not retry)."""
    attempt, limit = task.get("attempt"), task.get("maxAttempts")
    if not isinstance(attempt, int) or isinstance(attempt, bool):
        attempt = 1
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        limit = QUEUE_MAX_ATTEMPTS
    return attempt >= limit


def _describe(obj: DockyardObject, err: KubeError) -> str:
    return f"{obj.ref}: {err.__class__.__name__}: {err.message}"[:2000]


# --- I/O ---------------------------------------------------------------------------------------


def _log(ctx: TaskContext, task: Mapping[str, Any]) -> Any:
    return get_logger(
        "dockyard-tasks", node=ctx.node, instance=task.get("instanceId"), task=task.get("taskId")
    )


async def _render(spec: object, *, namespace: str) -> list[dict[str, Any]]:
    """:func:`render` off the event loop (a render takes tens of milliseconds)."""
    try:
        return await asyncio.to_thread(render, spec, namespace=namespace)
    except RecursionError:
        raise DockyardConfigError("nested too deep to render", source="task") from None


# --- task handlers -----------------------------------------------------------------------------


async def launch(ctx: TaskContext, checked: CheckedTask) -> None:
    """A ``dockyard`` task: render, check ownership, apply every object in order, report."""
    task = checked.task
    tid, iid, ns = checked.task_id, checked.instance_id, checked.kube_namespace
    blog = _log(ctx, task)
    try:
        manifests = await _render(task.get("spec"), namespace=ns)
        if not is_instance_id(iid):
            raise DockyardConfigError(f"{iid!r} is not an instance id", path="instanceId", source="task")
        # the queue refused these already; a spec that reached the daemon another way is not applied
        check_manifests(manifests, prefix="dockyard: ")
    except (DockyardConfigError, PodPolicyError) as exc:
        ctx.refuse_spec(task, what="dockyard", error=exc, namespace=ns, requester=task.get("requester"))
        blog.warning("dockyard launch refused", error=str(exc))
        return
    unserved = ctx.unserved(ns)
    if unserved:
        ctx.complete(task_id=tid, ok=False, error=unserved, retryable=False)
        return
    if ctx.stopping.is_set():
        return  # not started: the lease lapses and another daemon takes it
    manifests = mark(manifests, launch=iid)
    objs = [DockyardObject.of(m) for m in manifests]
    live = await live_objects(ctx.kubectl, manifests)
    foreign = [o for o, lv in zip(objs, live, strict=True) if _owner(lv, iid) is Ownership.FOREIGN]
    if foreign:
        await _refuse_collision(ctx, task, manifests, live, foreign)
        return
    if int(task.get("attempt") or 1) <= 1:
        ctx.tracker.report_unpinned(
            iid, Report(InstanceState.STARTING, None, f"applying {len(objs)} dockyard objects")
        )
    unchecked = [lv for lv in live if isinstance(lv, KubeError)]
    if unchecked:  # whose an object is could not be told: apply nothing
        outcomes = [
            ApplyOutcome(*object_key(m), error=lv if isinstance(lv, KubeError) else unchecked[0])
            for m, lv in zip(manifests, live, strict=True)
        ]
    else:
        outcomes = await apply_all(applier=ctx.kubectl, manifests=manifests, metrics=ctx.metrics)
    for obj, outcome in zip(objs, outcomes, strict=True):
        _audit_object(
            ctx, "apply", task, obj, result="ok" if outcome.ok else "failed", error=outcome.error, sha256=True
        )
    failures = [(o, out.error) for o, out in zip(objs, outcomes, strict=True) if out.error is not None]
    if not failures:
        ctx.metrics.launches.labels("applied").inc()
        refs = ", ".join(o.ref for o in objs)
        ctx.tracker.report_unpinned(
            iid, Report(InstanceState.RUNNING, None, f"{len(objs)} objects applied: {refs}")
        )
        ctx.complete(task_id=tid, ok=True, result={"objects": [o.to_json() for o in objs], "namespace": ns})
        blog.info("dockyard launch applied", objects=len(objs))
        return
    retryable = all(err.transient for _, err in failures)
    first = next(((o, e) for o, e in failures if not e.transient), failures[0])
    message = _describe(*first)
    if not retryable:
        applied = [m for m, out in zip(manifests, outcomes, strict=True) if out.ok]
        await _rollback(ctx, task, list(reversed(applied)))
    elif last_attempt(task):
        # the queue gives up after this one: leave nothing running (earlier attempts' objects too)
        await _rollback(ctx, task, list(reversed(manifests)))
        message = f"{message} (last attempt; rolled back)"
    ctx.metrics.launches.labels("failed").inc()
    ctx.complete(task_id=tid, ok=False, error=message, retryable=retryable)
    blog.warning("dockyard launch failed", error=message, retryable=retryable)


def _owner(live: Live, launch: str) -> Ownership | None:
    """How a live object relates to the launch; ``None`` when it could not be read."""
    return None if isinstance(live, KubeError) else ownership(live, launch=launch)


def collision_message(foreign: Sequence[DockyardObject], *, launch: str) -> str:
    """Why a launch whose object names are taken by objects it does not own failed."""
    refs = ", ".join(o.ref for o in foreign)
    return (
        f"{refs} already exist{'s' if len(foreign) == 1 else ''} in namespace {foreign[0].namespace} "
        f"and {'is' if len(foreign) == 1 else 'are'} not this launch's (no label "
        f"{LAUNCH_LABEL}={launch}): nothing was applied or deleted; rename the object in the infra "
        "(sandbox.name, kuberay.name) or remove the other one"
    )[:2000]


async def _refuse_collision(
    ctx: TaskContext,
    task: Mapping[str, Any],
    manifests: Sequence[Mapping[str, Any]],
    live: Sequence[Live],
    foreign: Sequence[DockyardObject],
) -> None:
    """A name taken by an object this launch does not own: apply nothing, fail for good; what
    earlier attempts of this launch applied (its own objects) is deleted, nothing else."""
    iid = str(task.get("instanceId"))
    message = collision_message(foreign, launch=iid)
    for obj in foreign:
        _audit_object(ctx, "apply", task, obj, result="refused-not-owned", error=None, sha256=True)
    ours = [m for m, lv in zip(manifests, live, strict=True) if _owner(lv, iid) is Ownership.OURS]
    await _rollback(ctx, task, list(reversed(ours)))
    ctx.metrics.launches.labels("failed").inc()
    ctx.complete(task_id=str(task["taskId"]), ok=False, error=message, retryable=False)
    _log(ctx, task).warning("dockyard launch refused: name taken", error=message)


def _audit_object(
    ctx: TaskContext,
    action: str,
    task: Mapping[str, Any],
    obj: DockyardObject,
    *,
    result: str,
    error: KubeError | None,
    sha256: bool = False,
) -> None:
    """One audit record for one dockyard object of a task."""
    ctx.audit.append(
        action,
        task=task.get("taskId"),
        instance=task.get("instanceId"),
        namespace=obj.namespace,
        node=ctx.node,
        requester=task.get("requester"),
        kind=obj.kind,
        name=obj.name,
        manifest_sha256=obj.sha256 if sha256 else None,
        result=result,
        error=None if error is None else _describe(obj, error),
    )


async def _rollback(
    ctx: TaskContext, task: Mapping[str, Any], manifests: Sequence[Mapping[str, Any]]
) -> None:
    """After a permanent failure or the last attempt: delete those of ``manifests`` (in the
    order given) that carry this launch's label; any other object is left alone."""
    if not manifests:
        return
    results = await delete_owned(ctx.kubectl, manifests, launch=str(task.get("instanceId")))
    names = {Deleted.DELETED: "rolled-back", Deleted.ABSENT: "already-gone", Deleted.NOT_OWNED: "not-owned"}
    for manifest, result in zip(manifests, results, strict=True):
        _audit_object(
            ctx,
            "delete",
            task,
            DockyardObject.of(manifest),
            result="rollback-failed" if isinstance(result, KubeError) else names[result],
            error=result if isinstance(result, KubeError) else None,
        )


async def stop(ctx: TaskContext, checked: CheckedTask) -> None:
    """A stop task of a dockyard instance: delete its objects in reverse order, report stopped."""
    task = checked.task
    tid, iid, ns = checked.task_id, checked.instance_id, checked.kube_namespace
    spec = (task.get("spec") or {}).get("dockyard")
    try:
        manifests = list(reversed(await _render(spec, namespace=ns)))
    except DockyardConfigError as exc:
        ctx.metrics.stops.labels("failed").inc()
        ctx.audit.append(
            "delete", task=tid, instance=iid, namespace=ns, node=ctx.node, result="failed", error=str(exc)
        )
        ctx.complete(task_id=tid, ok=False, error=f"bad dockyard spec: {exc}", retryable=False)
        return
    objs = [DockyardObject.of(m) for m in manifests]
    results = await delete_owned(ctx.kubectl, manifests, launch=iid)
    deleted: list[str] = []
    gone: list[str] = []
    others: list[str] = []
    errors: list[tuple[DockyardObject, KubeError]] = []
    for obj, result in zip(objs, results, strict=True):
        outcome = "deleted"
        if isinstance(result, KubeError):
            errors.append((obj, result))
            outcome = "failed"
        elif result is Deleted.DELETED:
            deleted.append(obj.ref)
        elif result is Deleted.NOT_OWNED:
            others.append(obj.ref)
            outcome = "not-owned"
        else:
            gone.append(obj.ref)
            outcome = "already-gone"
        _audit_object(
            ctx, "delete", task, obj, result=outcome, error=result if isinstance(result, KubeError) else None
        )
    if errors:
        ctx.metrics.stops.labels("failed").inc()
        retryable = all(e.transient for _, e in errors)
        message = "delete failed: " + "; ".join(_describe(o, e) for o, e in errors)
        ctx.complete(task_id=tid, ok=False, error=message[:4000], retryable=retryable)
        _log(ctx, task).warning("dockyard stop failed", error=message, retryable=retryable)
        return
    ctx.metrics.stops.labels("deleted" if deleted else "already-gone").inc()
    ctx.tracker.report_unpinned(
        iid,
        Report(
            InstanceState.STOPPED,
            Reason.STOPPED,
            f"stopped on request ({len(deleted)} objects deleted, {len(gone)} already gone"
            + (f", {len(others)} not this launch's left alone: {', '.join(others)}" if others else "")
            + ")",
        ),
    )
    summary: dict[str, Any] = {"deleted": deleted, "alreadyGone": gone}
    if others:
        summary["notOwned"] = others
    ctx.complete(task_id=tid, ok=True, result=summary)
    _log(ctx, task).info("dockyard stop done", deleted=len(deleted), already_gone=len(gone))
