"""Value types of the queue service: roles, principals, settings, checked reports and claims.

The wire types (task kinds, statuses, JSON shapes, time) live in :mod:`nymph.protocol`."""

from __future__ import annotations

import enum
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nymph.launch.placement import NodeOffer
from nymph.launch.pullwait import DEFAULT_IMAGE_PULL_TIMEOUT
from nymph.protocol import TaskJSON
from nymph.queue.direct.settings import DirectSettings
from nymph.queue.offers import offer_text


class Role(str, enum.Enum):
    USER = "user"
    DAEMON = "daemon"
    #: An operator: every user route in every namespace, and the namespaces' quotas.
    ADMIN = "admin"


@dataclass(frozen=True)
class DaemonSession:
    """A registered daemon: its own credential's identity (never the credential itself).

    ``namespaces`` are the kube namespaces it serves (empty: every namespace); ``scope`` is the
    owner-namespace scope of the bootstrap token it registered with (None: every namespace).
    """

    session_id: str
    daemon_id: str
    node: str
    namespaces: tuple[str, ...]
    token_id: str
    scope: str | None

    def serves(self, kube_namespace: str) -> bool:
        return not self.namespaces or kube_namespace in self.namespaces


@dataclass(frozen=True)
class Principal:
    """Who is calling: a token's id, role and namespace scope (never the token itself), and for
    a registered daemon its session."""

    token_id: str
    role: Role
    namespace: str | None = None
    name: str | None = None
    session: DaemonSession | None = None

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
    #: A long-poll of at least twenty times this ends on a whole multiple of it on the queue's
    #: clock, up to this much early (see :func:`nymph.queue.notify.hold_deadline`).
    coalesce_seconds: float = 1.0


@dataclass(frozen=True)
class LimitSettings:
    max_body_bytes: int = 1024 * 1024
    max_log_bytes: int = 256 * 1024
    token_cache_seconds: float = 30.0


@dataclass(frozen=True)
class SessionSettings:
    #: A daemon session lapses this long after its last dispatch call (each call extends it).
    ttl_seconds: float = 900.0
    #: Live sessions kept at most; registering beyond that (after expired ones are dropped) is a 429.
    max_sessions: int = 10_000


@dataclass(frozen=True)
class OutputSettings:
    """Instances' logs and result files (see :mod:`nymph.queue.output`)."""

    #: Bytes of log kept per instance; beyond it the oldest middle part is dropped.
    log_cap_bytes: int = 8 * 1024 * 1024
    #: Bytes of result files kept per instance.
    results_cap_bytes: int = 64 * 1024 * 1024
    #: Logs and results are removed this long after their instance stopped.
    retention_seconds: float = 7 * 86_400.0
    #: How often the sweeper looks for expired output (and expired instances).
    purge_interval: float = 60.0
    #: Stopped instances expire ``retention_seconds`` after they stopped, at most
    #: ``expire_batch`` per transaction and ``expire_batches`` transactions per pass; what is
    #: left of one (a tombstone: its GET says it expired) goes ``tombstone_seconds`` later.
    expire_batch: int = 200
    expire_batches: int = 10
    tombstone_seconds: float = 30 * 86_400.0
    #: A followed log of a stopped instance ends when no chunk came for this long (a daemon that
    #: ships no log, or a log that never starts).
    follow_grace_seconds: float = 10.0


@dataclass(frozen=True)
class LaunchSettings:
    """Defaults the queue gives every launch whose mode does not set them."""

    #: Seconds a Pod's image may fail to pull before the launch is stopped (``ImagePull``);
    #: ``--image-pull-timeout``, a mode's ``image_pull_timeout`` wins.
    image_pull_timeout: int = DEFAULT_IMAGE_PULL_TIMEOUT


@dataclass(frozen=True)
class TenancySettings:
    """What each team (control-plane namespace) may reach in the cluster, set by the operator.

    ``kube_namespaces``: control-plane namespace -> the Kubernetes namespaces its scoped tokens
    may target (absent: only the one of the same name); unscoped tokens may target any.
    ``service_accounts``: control-plane namespace -> the ServiceAccounts its launches may run as
    (none: no ``service_account`` is accepted). ``max_replicas``: the most worker replicas one
    dockyard launch may ask for. ``max_pod_requests``: resource -> the most of it (a Kubernetes
    quantity) one pod of a dockyard launch may request (none: no cap).
    """

    kube_namespaces: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    service_accounts: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    max_replicas: int = 64
    max_pod_requests: Mapping[str, str] = field(default_factory=dict)

    def kube_namespaces_of(self, namespace: str) -> tuple[str, ...]:
        return self.kube_namespaces.get(namespace) or (namespace,)

    def may_target(self, principal: Principal, kube_namespace: str) -> bool:
        """Whether ``principal`` may launch into ``kube_namespace``."""
        if principal.namespace is None:
            return True
        return kube_namespace in self.kube_namespaces_of(principal.namespace)

    def may_run_as(self, namespace: str, service_account: str) -> bool:
        return service_account in self.service_accounts.get(namespace, ())


@dataclass(frozen=True)
class QueueSettings:
    """All tunables of the service, grouped; passed to :func:`nymph.queue.http.app.create_app`."""

    lease: LeaseSettings = field(default_factory=LeaseSettings)
    retry: RetrySettings = field(default_factory=RetrySettings)
    poll: PollSettings = field(default_factory=PollSettings)
    limits: LimitSettings = field(default_factory=LimitSettings)
    sessions: SessionSettings = field(default_factory=SessionSettings)
    direct: DirectSettings = field(default_factory=DirectSettings)
    output: OutputSettings = field(default_factory=OutputSettings)
    tenancy: TenancySettings = field(default_factory=TenancySettings)
    launch: LaunchSettings = field(default_factory=LaunchSettings)


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
    #: How the ``user`` container ended (exit code, reason, message), once it did.
    termination: tuple[int, str, str] | None = None


@dataclass(frozen=True)
class TaskCompletion:
    """One task's completion from a daemon, already checked (the body of a single completion,
    or one item of a batch); ``attempt`` is the lease's epoch as claimed (0: not sent)."""

    task_id: str
    ok: bool
    error: str | None = None
    retryable: bool = False
    result: Mapping[str, Any] | None = None
    attempt: int = 0


@dataclass(frozen=True)
class ClaimRequest:
    daemon_id: str
    node: str
    namespaces: tuple[str, ...]
    capacity: int
    lease_seconds: int
    #: What the daemon's node offers; None (an older daemon, or no node): launches go unfiltered.
    node_info: NodeOffer | None = None
    #: ``node_info`` as the daemons table keeps it, when already known (the claim route's offer
    #: cache, :mod:`nymph.queue.offers`); worked out from ``node_info`` when None.
    node_info_text: str | None = None

    @functools.cached_property
    def record(self) -> tuple[str, str, int, str | None]:
        """The daemon as the daemons table keeps it: node, namespaces, capacity and offer as
        text (worked out once per request: each read of the claim compares it)."""
        offer = None
        if self.node_info is not None:
            offer = self.node_info_text or offer_text(self.node_info)
        return self.node, json.dumps(list(self.namespaces)), self.capacity, offer


@dataclass(frozen=True)
class ClaimResult:
    tasks: list[TaskJSON]
    #: Epoch seconds at which some task may become claimable without a new insert (a backoff
    #: ending, a lease expiring, a stop task's node pin lapsing), or None.
    next_due: float | None
    #: Instances that this claim's housekeeping (see ``retire``) changed; their waiters are woken.
    settled: frozenset[str] = frozenset()
    #: Nothing was claimed, yet some task is claimable by another daemon (another node or
    #: namespace): a wake-up this claim received is handed on.
    work_elsewhere: bool = False
    #: Seconds each launch handed out on its first attempt waited since its POST wrote it.
    waited: tuple[float, ...] = ()
    #: An idle claim's daemon record is as claimed but due a refresh of its ``last_seen``: the
    #: store writes it with the others due in one batch (:meth:`nymph.queue.store.Store.flush_seen`).
    seen_due: bool = False
