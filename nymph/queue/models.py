"""Value types of the queue: roles, task kinds and statuses, settings, JSON shapes, time."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NotRequired, TypedDict


class Role(str, enum.Enum):
    USER = "user"
    DAEMON = "daemon"


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


@dataclass(frozen=True)
class Principal:
    """Who is calling: a token's id, role and namespace scope (never the token itself)."""

    token_id: str
    role: Role
    namespace: str | None = None
    name: str | None = None

    @property
    def requester(self) -> str:
        return f"{self.name} ({self.token_id})" if self.name else self.token_id

    def may_touch(self, namespace: str) -> bool:
        return self.namespace is None or self.namespace == namespace


# --- settings --------------------------------------------------------------------------------


@dataclass(frozen=True)
class LeaseSettings:
    default_seconds: int = 60
    max_seconds: int = 3600
    #: How often the sweeper hands expired leases back.
    sweep_interval: float = 5.0
    #: A stop task is pinned to its instance's node; after this long unclaimed, any daemon may take it.
    stop_node_fallback: float = 30.0


@dataclass(frozen=True)
class RetrySettings:
    max_attempts: int = 5
    backoff_base: float = 2.0
    backoff_max: float = 300.0

    def backoff(self, attempt: int) -> float:
        """Delay before attempt ``attempt + 1``: base * 2**(attempt-1), capped."""
        return float(min(self.backoff_max, self.backoff_base * 2 ** max(0, attempt - 1)))


@dataclass(frozen=True)
class PollSettings:
    claim_default_wait: float = 30.0
    max_wait: float = 60.0


@dataclass(frozen=True)
class LimitSettings:
    max_body_bytes: int = 1024 * 1024
    max_log_bytes: int = 256 * 1024
    token_cache_seconds: float = 30.0


@dataclass(frozen=True)
class QueueSettings:
    """All tunables of the service, grouped; passed to :func:`nymph.queue.app.create_app`."""

    lease: LeaseSettings = field(default_factory=LeaseSettings)
    retry: RetrySettings = field(default_factory=RetrySettings)
    poll: PollSettings = field(default_factory=PollSettings)
    limits: LimitSettings = field(default_factory=LimitSettings)


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


class ActiveJSON(TypedDict):
    instanceId: str
    namespace: str
    kubeNamespace: str
    state: str
    node: str | None


@dataclass(frozen=True)
class Report:
    """One state report from a daemon, already checked."""

    seq: int
    instance_id: str
    state: str
    reason: str | None
    message: str | None
    node: str | None
    at: float


@dataclass(frozen=True)
class ClaimRequest:
    daemon_id: str
    node: str
    namespaces: tuple[str, ...]
    capacity: int
    lease_seconds: int


@dataclass(frozen=True)
class ClaimResult:
    tasks: list[TaskJSON]
    #: Epoch seconds at which some task may become claimable without a new insert (a backoff
    #: ending, a lease expiring, a stop task's node pin lapsing), or None.
    next_due: float | None


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
