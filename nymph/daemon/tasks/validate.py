"""Checking a task off the wire before anything acts on it (pure).

The daemon does not trust the queue: its connection may be plain HTTP, so every field of a
task is checked here, once, as it is claimed (:func:`intake`), the way the queue checks a launch
(:mod:`nymph.launch.names`); handlers receive the :class:`CheckedTask`. A task that fails is
completed as a non-retryable failure naming the field; nothing from it reaches a command line,
a path or the API server.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from nymph.errors import NymphError, ValidationError
from nymph.launch.names import check_instance_id, check_namespace
from nymph.protocol import TaskJSON, TaskKind

_TASK_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_REQUESTER_MAX = 512
MAX_GRACE_SECONDS = 86_400  # a day: a longer grace period is not a grace period
MAX_ATTEMPT = 1_000_000


class BadTask(NymphError):
    """A task whose fields cannot be trusted; ``task_id`` is set when the task can be completed."""

    def __init__(self, message: str, *, task_id: str | None) -> None:
        super().__init__(message)
        self.task_id = task_id


@dataclass(frozen=True)
class CheckedTask:
    """A task whose every field checked out: its checked identity, what a handler may pass on,
    and the task as sent (its other fields: spec, requester, attempt, grace period)."""

    task_id: str
    kind: TaskKind
    instance_id: str
    namespace: str  # the owner's (queue) namespace
    kube_namespace: str  # where its Pod / objects live: one this daemon serves
    task: TaskJSON = field(compare=False, repr=False)


@dataclass(frozen=True)
class Refused:
    """A claimed task that does not check out: it is failed for good, never handled."""

    task_id: str
    error: BadTask


def intake(task: object, *, served: Collection[str]) -> CheckedTask | Refused | None:
    """The one check of a task as it is claimed: the checked task, a refusal, or None for a task
    without a usable ``taskId`` (nothing to complete it by)."""
    try:
        return check_task(task, served=served)
    except BadTask as exc:
        return None if exc.task_id is None else Refused(exc.task_id, exc)


def usable_task_id(task: object) -> str | None:
    """The task's id when it is safe to key, log and complete by; else None."""
    if not isinstance(task, Mapping):
        return None
    tid = task.get("taskId")
    if isinstance(tid, str) and _TASK_ID_RE.match(tid):
        return tid
    return None


def _field(name: str, check: Any, value: object) -> str:
    try:
        return str(check(value, field=name))
    except ValidationError as exc:
        raise ValueError(str(exc)) from None


def _check_spec(kind: TaskKind, spec: object, *, instance_id: str, kube_namespace: str) -> None:
    if kind in (TaskKind.LAUNCH, TaskKind.PROBE):
        if not isinstance(spec, Mapping):
            raise ValueError(f"spec: a {kind.value} task needs a launch spec object")
        # The Pod is named and placed by the spec: it must be the task's instance and namespace.
        if spec.get("instanceId") != instance_id:
            raise ValueError("spec.instanceId: does not match the task's instanceId")
        if spec.get("namespace") != kube_namespace:
            raise ValueError("spec.namespace: does not match the task's kubeNamespace")
    elif kind is TaskKind.DOCKYARD:
        if not isinstance(spec, Mapping):
            raise ValueError("spec: a dockyard task needs a dockyard spec object")
    elif spec is not None:  # a stop: no spec, or the dockyard spec of what it stops
        if not isinstance(spec, Mapping):
            raise ValueError("spec: a stop task's spec must be an object or null")
        if "dockyard" in spec and not isinstance(spec["dockyard"], Mapping):
            raise ValueError("spec.dockyard: must be an object")


def _check_extras(task: Mapping[str, Any]) -> None:
    grace = task.get("gracePeriodSeconds")
    if grace is not None and (
        isinstance(grace, bool) or not isinstance(grace, int) or not 0 <= grace <= MAX_GRACE_SECONDS
    ):
        raise ValueError(f"gracePeriodSeconds: must be an integer from 0 to {MAX_GRACE_SECONDS}")
    attempt = task.get("attempt")
    if attempt is not None and (
        isinstance(attempt, bool) or not isinstance(attempt, int) or not 1 <= attempt <= MAX_ATTEMPT
    ):
        raise ValueError("attempt: must be a positive integer")
    requester = task.get("requester")
    if requester is not None and (not isinstance(requester, str) or len(requester) > _REQUESTER_MAX):
        raise ValueError(f"requester: must be a string of at most {_REQUESTER_MAX} characters")


def check_task(task: object, *, served: Collection[str]) -> CheckedTask:
    """Check every field of ``task``; :class:`BadTask` names the first that is wrong."""
    tid = usable_task_id(task)
    if tid is None or not isinstance(task, Mapping):
        raise BadTask("bad task: taskId is missing or not a task id", task_id=None)
    try:
        kind = TaskKind(task.get("kind"))
    except ValueError:
        raise BadTask(f"unknown task kind {str(task.get('kind'))[:64]!r}", task_id=tid) from None
    try:
        instance_id = _field("instanceId", check_instance_id, task.get("instanceId"))
        namespace = _field("namespace", check_namespace, task.get("namespace"))
        kube_namespace = _field("kubeNamespace", check_namespace, task.get("kubeNamespace"))
        if kube_namespace not in served:
            raise ValueError(
                f"kubeNamespace: this daemon does not serve namespace {kube_namespace!r} "
                f"(it serves {', '.join(sorted(served))})"
            )
        _check_spec(kind, task.get("spec"), instance_id=instance_id, kube_namespace=kube_namespace)
        _check_extras(task)
    except ValueError as exc:
        raise BadTask(f"bad task: {exc}", task_id=tid) from None
    return CheckedTask(tid, kind, instance_id, namespace, kube_namespace, cast(TaskJSON, task))
