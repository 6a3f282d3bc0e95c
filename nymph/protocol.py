"""The wire contract shared by the queue, its client and the daemon (pure: no I/O).

Task kinds and statuses as ``str`` enums, the JSON shapes of tasks, instances, reports and the
active list, and the one time format every route uses. The queue, :mod:`nymph.client` and the
daemon import their types from here; none of them imports another for a type.
"""

from __future__ import annotations

import enum
import time
from datetime import UTC, datetime
from typing import Any, NotRequired, TypedDict


class TaskKind(str, enum.Enum):
    LAUNCH = "launch"
    STOP = "stop"
    PROBE = "probe"
    #: A dockyard recipe + infra, rendered and applied in order by the daemon (no Pod of its own).
    DOCKYARD = "dockyard"


#: Task kinds that bring an instance up; a stop is ordered after the latest one of these.
START_KINDS = (TaskKind.LAUNCH.value, TaskKind.DOCKYARD.value)


class TaskStatus(str, enum.Enum):
    PENDING = "pending"
    LEASED = "leased"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (TaskStatus.DONE, TaskStatus.FAILED, TaskStatus.CANCELLED)


FINISHED_STATUSES = tuple(s.value for s in TaskStatus if s.finished)


# --- JSON shapes -----------------------------------------------------------------------------


class HistoryEntry(TypedDict):
    state: str
    reason: str | None
    message: str
    at: str


class InstanceJSON(TypedDict):
    instanceId: str
    providerName: str
    namespace: str
    kubeNamespace: str
    state: str
    reason: str | None
    message: str
    node: str | None
    launchedAt: str
    updatedAt: str
    version: int
    requester: str
    history: list[HistoryEntry]
    #: Only on a ``queued`` launch that no live daemon's node can run: why (e.g. "no daemon's
    #: node matches node_selector gpu=a100").
    waiting: NotRequired[str]
    #: Once the Pod's ``user`` container ended: its exit code, termination reason and message.
    exitCode: NotRequired[int]
    terminationReason: NotRequired[str]
    terminationMessage: NotRequired[str]
    #: Why some result files were not kept (over the cap, refused paths).
    resultsError: NotRequired[str]
    #: A member of a launch group: the group and its place in it (0-based).
    groupId: NotRequired[str]
    groupIndex: NotRequired[int]
    #: A launch with a retry policy, or a retry: which attempt this is (1 for the first), the
    #: instance it retries and the one that retries it.
    attempt: NotRequired[int]
    retryOf: NotRequired[str]
    retriedAs: NotRequired[str]


class EventJSON(TypedDict):
    """One change of an instance in its namespace's event stream: the instance right after it,
    and what changed (``created``, ``state``, ``reason``, ``exitCode``, ``node``, ``waiting``)."""

    cursor: str
    at: str
    namespace: str
    providerName: str
    instanceId: str
    changes: list[str]
    state: str
    reason: str | None
    message: str
    exitCode: int | None
    attempt: int | None
    group: str | None
    node: str | None
    #: Why a queued launch waits when no live daemon's node can run it, and that reason's kind.
    waiting: str | None
    waitingKind: str | None


class LaunchAccepted(TypedDict):
    instanceId: str
    state: str
    providerName: str
    launchedAt: str


class TaskJSON(TypedDict):
    taskId: str
    kind: str
    instanceId: str | None
    namespace: str
    kubeNamespace: str
    provider: str
    spec: dict[str, Any] | None
    requester: str
    attempt: int
    leaseExpiresAt: str
    gracePeriodSeconds: NotRequired[int]


class TaskStatusJSON(TypedDict):
    taskId: str
    kind: str
    status: str
    result: dict[str, Any] | None
    error: str | None
    attempts: int


class DaemonJSON(TypedDict):
    daemonId: str
    node: str
    namespaces: list[str]
    lastSeen: str
    capacity: int


class SessionJSON(TypedDict):
    """The answer to ``POST /v1/dispatch/register``: a daemon's own credential (shown once) and
    the identity it is bound to."""

    sessionToken: str
    daemonId: str
    node: str
    namespaces: list[str]
    expiresAt: str
    ttlSeconds: float


class ActiveJSON(TypedDict):
    instanceId: str
    namespace: str
    kubeNamespace: str
    state: str
    node: str | None


class ReportJSON(TypedDict):
    """One state report a daemon sends in ``POST /v1/dispatch/report`` (``at`` is ISO 8601)."""

    seq: int
    instanceId: str
    state: str
    reason: NotRequired[str | None]
    message: NotRequired[str | None]
    node: NotRequired[str | None]
    at: NotRequired[str]


class ReportAck(TypedDict):
    """The answer to a report batch: how many were new, and the stream's highest seq."""

    accepted: int
    lastSeq: int


class RenewAnswer(TypedDict):
    renewed: list[str]
    lost: list[str]


class CompleteAnswer(TypedDict):
    """``status`` is done, failed, cancelled or requeued (then ``notBefore``)."""

    status: str
    duplicate: NotRequired[bool]
    notBefore: NotRequired[str]


# --- time ------------------------------------------------------------------------------------


def now() -> float:
    return time.time()


def iso(ts: float) -> str:
    """Epoch seconds -> ``2024-05-01T12:00:00.123Z``."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_iso(text: str) -> float:
    """ISO 8601 -> epoch seconds; a value without zone is taken as UTC. Raises ValueError."""
    dt = datetime.fromisoformat(text)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()
