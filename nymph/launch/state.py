"""Pod -> instance state, and why a Pod stopped (pure)."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any


class InstanceState(str, enum.Enum):
    QUEUED = "queued"  # on the daemon path, until a daemon has applied the Pod
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"
    UNKNOWN = "unknown"

    @property
    def terminal(self) -> bool:
        return self is InstanceState.STOPPED


class Reason(str, enum.Enum):
    """Failure taxonomy for a Pod that did not (or will not) complete normally."""

    COMPLETED = "Completed"
    ERROR = "Error"
    OOM_KILLED = "OOMKilled"
    IMAGE_PULL = "ImagePull"
    UNSCHEDULABLE = "Unschedulable"
    EVICTED = "Evicted"
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    CREATE_CONTAINER = "CreateContainerError"
    STOPPED = "Stopped"  # stopped on request
    DELETED = "Deleted"  # the Pod disappeared without a stop request
    NODE_LOST = "NodeLost"  # the Pod was removed because its node went away
    LAUNCH_FAILED = "LaunchFailed"  # the API server refused the Pod

    @property
    def failed(self) -> bool:
        return self not in (Reason.COMPLETED, Reason.STOPPED)


_PHASE_STATE = {
    "Pending": InstanceState.STARTING,
    "Running": InstanceState.RUNNING,
    "Succeeded": InstanceState.STOPPED,
    "Failed": InstanceState.STOPPED,
}
_IMAGE_PULL_REASONS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "RegistryUnavailable"}
)
_CREATE_REASONS = frozenset({"CreateContainerConfigError", "CreateContainerError", "RunContainerError"})


#: A Pod's document is plain dicts: ``dict`` first is an exact type check, where the ``Mapping``
#: ABC alone took a slow instance check at every step (a few per cent of a daemon's CPU).
_MAPPING = (dict, Mapping)


def _get(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, _MAPPING):
            return None
        obj = obj.get(key)
    return obj


def pod_state(pod: Mapping[str, Any]) -> InstanceState:
    """A ``deletionTimestamp`` means ``stopping`` whatever the phase; else map the phase."""
    if _get(pod, "metadata", "deletionTimestamp"):
        return InstanceState.STOPPING
    phase = _get(pod, "status", "phase")
    return _PHASE_STATE.get(phase, InstanceState.UNKNOWN) if isinstance(phase, str) else InstanceState.UNKNOWN


def _container_statuses(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    out: list[Mapping[str, Any]] = []
    for key in ("initContainerStatuses", "containerStatuses"):
        statuses = _get(pod, "status", key)
        if isinstance(statuses, list):
            out.extend(s for s in statuses if isinstance(s, _MAPPING))
    return out


def container_started(pod: Mapping[str, Any], *, container: str = "user") -> bool:
    """Whether ``container`` has run (it is running or has ended after starting)."""
    for cs in _container_statuses(pod):
        if cs.get("name") == container:
            state = cs.get("state") or {}
            return state.get("running") is not None or bool(
                (state.get("terminated") or {}).get("containerID")
            )
    return False


def container_termination(pod: Mapping[str, Any], *, container: str = "user") -> tuple[int, str, str] | None:
    """How ``container`` of a Pod ended: (exit code, termination reason, termination message),
    or None while it has not ended."""
    for cs in _container_statuses(pod):
        if cs.get("name") != container:
            continue
        terminated = _get(cs, "state", "terminated")
        if isinstance(terminated, _MAPPING) and isinstance(terminated.get("exitCode"), int):
            return (
                int(terminated["exitCode"]),
                str(terminated.get("reason") or ""),
                str(terminated.get("message") or ""),
            )
    return None


#: ``DisruptionTarget`` reasons of a Pod removed because its node went away: the Pod garbage
#: collector's for a Pod bound to a node that no longer exists, the node lifecycle controller's
#: for one on a node that stopped answering (its ``NoExecute`` taint).
NODE_LOST_REASONS = frozenset({"DeletionByPodGC", "DeletionByTaintManager"})


def deleted_reason(pod: Mapping[str, Any]) -> Reason:
    """Why a Pod nymph did not delete is gone: ``NodeLost`` when its ``DisruptionTarget``
    condition says its node went away, else ``Deleted`` (someone else deleted it)."""
    conditions = _get(pod, "status", "conditions")
    for cond in conditions if isinstance(conditions, list) else ():
        if (
            isinstance(cond, _MAPPING)
            and cond.get("type") == "DisruptionTarget"
            and cond.get("status") == "True"
            and cond.get("reason") in NODE_LOST_REASONS
        ):
            return Reason.NODE_LOST
    return Reason.DELETED


def pod_reason(pod: Mapping[str, Any]) -> tuple[Reason | None, str]:
    """Why a Pod is (or will end up) stopped, with a human message.

    Returns ``(None, "")`` for a Pod that is healthy so far. Pending Pods report
    ``Unschedulable`` / ``ImagePull`` / ``CreateContainerError`` as soon as they show, so a user
    sees why nothing starts.
    """
    status_reason = _get(pod, "status", "reason")
    message = str(_get(pod, "status", "message") or "")
    if status_reason == "Evicted":
        return Reason.EVICTED, message
    if status_reason == "DeadlineExceeded":
        return Reason.DEADLINE_EXCEEDED, message
    statuses = _container_statuses(pod)
    for cs in statuses:
        terminated = _get(cs, "state", "terminated") or _get(cs, "lastState", "terminated")
        if isinstance(terminated, _MAPPING) and terminated.get("reason") == "OOMKilled":
            return Reason.OOM_KILLED, str(terminated.get("message") or "container was OOM-killed")
    for cs in statuses:
        waiting = _get(cs, "state", "waiting")
        if isinstance(waiting, _MAPPING):
            reason = waiting.get("reason")
            if reason in _IMAGE_PULL_REASONS:
                return Reason.IMAGE_PULL, str(waiting.get("message") or reason)
            if reason in _CREATE_REASONS:
                return Reason.CREATE_CONTAINER, str(waiting.get("message") or reason)
    conditions = _get(pod, "status", "conditions")
    if isinstance(conditions, list):
        for cond in conditions:
            if (
                isinstance(cond, _MAPPING)
                and cond.get("type") == "PodScheduled"
                and cond.get("status") == "False"
                and cond.get("reason") == "Unschedulable"
            ):
                return Reason.UNSCHEDULABLE, str(cond.get("message") or "")
    phase = _get(pod, "status", "phase")
    if phase == "Succeeded":
        return Reason.COMPLETED, ""
    if phase == "Failed":
        for cs in statuses:
            terminated = _get(cs, "state", "terminated")
            if isinstance(terminated, _MAPPING):
                code = terminated.get("exitCode")
                detail = terminated.get("message") or terminated.get("reason") or ""
                return Reason.ERROR, f"exit code {code}" + (f": {detail}" if detail else "")
        return Reason.ERROR, message or str(status_reason or "")
    return None, ""
