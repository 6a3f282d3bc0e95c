"""What a task handler may use: a small frozen context, never the daemon itself."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from nymph.daemon.audit import AuditLog
from nymph.daemon.diskhealth import DiskHealth
from nymph.daemon.metrics import Metrics
from nymph.daemon.outboxitems import Complete
from nymph.daemon.tracker import Tracker
from nymph.daemon.workdirs import Workdirs
from nymph.kube.applier import Applier
from nymph.kube.errors import KubeError, Unavailable
from nymph.kube.kubectl import Kubectl
from nymph.protocol import TaskJSON


@dataclass(frozen=True)
class TaskContext:
    applier: Applier  # Pods: kubectl or the API, as --apply-with says
    kubectl: Kubectl  # dockyard objects: always kubectl (the API applier handles only Pods)
    tracker: Tracker
    complete: Complete
    audit: AuditLog
    metrics: Metrics
    workdirs: Workdirs
    namespaces: tuple[str, ...]  # the namespaces this daemon serves
    node: str | None
    daemon_id: str
    workdir_root: Path
    delete_grace_seconds: int | None
    stopping: asyncio.Event
    disk: DiskHealth = field(default_factory=DiskHealth)  # marked when a write under the root fails
    #: Whether the daemon reaches the API server (its Pod watches are connected).
    kube_ok: Callable[[], bool] = lambda: True
    #: Stop renewing a task and release its lease (the queue counts no attempt for it).
    hand_back: Callable[[str], None] | None = None

    def in_outage(self, error: KubeError) -> bool:
        """Whether ``error`` is an API server outage the daemon can see: :class:`Unavailable`
        while its watches are down too. Such a failure costs a task none of its attempts: the
        handler hands it back (:meth:`give_back`) instead of completing it, and claiming pauses
        until the watches are connected again."""
        return self.hand_back is not None and isinstance(error, Unavailable) and not self.kube_ok()

    def give_back(self, task_id: str) -> None:
        """Release ``task_id`` to the queue without completing it (see :meth:`in_outage`)."""
        assert self.hand_back is not None
        self.hand_back(task_id)

    def unserved(self, namespace: str) -> str | None:
        """Why a task for ``namespace`` cannot run here, or None when this daemon serves it."""
        if namespace in self.namespaces:
            return None
        return f"this daemon does not serve namespace {namespace!r} (it serves {', '.join(self.namespaces)})"

    def refuse_spec(
        self,
        task: TaskJSON,
        *,
        what: str,
        error: Exception,
        namespace: str | None = None,
        requester: str | None = None,
    ) -> None:
        """A launch whose spec cannot be used: count it, audit it, fail it for good."""
        self.metrics.launches.labels("failed").inc()
        self.audit.append(
            "apply",
            task=task["taskId"],
            instance=task.get("instanceId"),
            namespace=namespace,
            node=self.node,
            requester=requester,
            result="failed",
            error=str(error),
        )
        self.complete(task_id=task["taskId"], ok=False, error=f"bad {what} spec: {error}", retryable=False)
