"""Reading the status of live objects and Ray jobs into lines and verdicts (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

#: KubeRay ``jobDeploymentStatus`` values after which nothing more happens.
TERMINAL_DEPLOYMENT = frozenset({"Complete", "Failed", "ValidationFailed"})
#: Ray job statuses (Jobs REST API and RayJob ``jobStatus``).
TERMINAL_JOB = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})


@dataclass(frozen=True)
class RayJobPhase:
    deployment: str  # jobDeploymentStatus ("" before the operator has seen it)
    job: str  # jobStatus
    cluster: str
    message: str

    @property
    def terminal(self) -> bool:
        return self.deployment in TERMINAL_DEPLOYMENT

    @property
    def succeeded(self) -> bool:
        return self.deployment == "Complete" and self.job == "SUCCEEDED"

    def key(self) -> tuple[str, str]:
        """What a follower reports a change of."""
        return self.deployment, self.job

    def line(self) -> str:
        parts = [f"deployment={self.deployment or 'New'}", f"job={self.job or '-'}"]
        if self.cluster:
            parts.append(f"cluster={self.cluster}")
        if self.message and (self.terminal or self.deployment in ("Failed", "Retrying")):
            parts.append(f"({_one_line(self.message)})")
        return " ".join(parts)


def rayjob_phase(obj: Mapping[str, Any]) -> RayJobPhase:
    st = obj.get("status") or {}
    return RayJobPhase(
        deployment=str(st.get("jobDeploymentStatus") or ""),
        job=str(st.get("jobStatus") or ""),
        cluster=str(st.get("rayClusterName") or ""),
        message=str(st.get("message") or st.get("reason") or ""),
    )


def _one_line(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def deployment_ready(obj: Mapping[str, Any]) -> tuple[int, int]:
    """(ready replicas, desired replicas) of a Deployment."""
    desired = (obj.get("spec") or {}).get("replicas")
    ready = (obj.get("status") or {}).get("readyReplicas") or 0
    return int(ready), int(desired if isinstance(desired, int) else 1)


def raycluster_line(obj: Mapping[str, Any]) -> str:
    st = obj.get("status") or {}
    state = st.get("state") or "pending"
    parts = [f"state={state}"]
    desired = st.get("desiredWorkerReplicas")
    if desired is not None:
        parts.append(f"workers={st.get('availableWorkerReplicas') or 0}/{desired}")
    head = st.get("head") or {}
    if head.get("serviceName"):
        parts.append(f"head-svc={head['serviceName']}")
    if st.get("reason"):
        parts.append(f"({_one_line(str(st['reason']))})")
    return " ".join(parts)


def object_line(obj: Mapping[str, Any]) -> str:
    """One status line for a live object of any kind dockyard applies."""
    kind = obj.get("kind")
    spec = obj.get("spec") or {}
    st = obj.get("status") or {}
    if kind == "Deployment":
        ready, desired = deployment_ready(obj)
        return f"{ready}/{desired} ready"
    if kind == "Service":
        ports = ",".join(str(p.get("port")) for p in spec.get("ports") or [])
        return f"{spec.get('type', 'ClusterIP')} {spec.get('clusterIP') or '-'} port {ports}"
    if kind == "PodDisruptionBudget":
        return f"{st.get('currentHealthy', 0)} healthy, {st.get('disruptionsAllowed', 0)} disruptions allowed"
    if kind == "RayJob":
        return rayjob_phase(obj).line()
    if kind == "RayCluster":
        return raycluster_line(obj)
    return "present"


def age(timestamp: str | None, *, now: datetime | None = None) -> str:
    if not timestamp:
        return "-"
    try:
        then = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return "-"
    seconds = int(((now or datetime.now(UTC)) - then).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    lines = [
        "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in [headers, *rows]
    ]
    return "\n".join(lines) + "\n"


def raycluster_row(obj: Mapping[str, Any], *, now: datetime | None = None) -> list[str]:
    meta = obj.get("metadata") or {}
    st = obj.get("status") or {}
    workers = "-"
    if st.get("desiredWorkerReplicas") is not None:
        workers = f"{st.get('availableWorkerReplicas') or 0}/{st['desiredWorkerReplicas']}"
    owner = next(
        (o.get("name") for o in meta.get("ownerReferences") or [] if o.get("kind") == "RayJob"), None
    )
    return [
        str(meta.get("name")),
        str(meta.get("namespace")),
        str(st.get("state") or "pending"),
        workers,
        str(st.get("desiredGPU") or 0),
        f"rayjob/{owner}" if owner else "-",
        age(meta.get("creationTimestamp"), now=now),
    ]


RAYCLUSTER_HEADERS = ("NAME", "NAMESPACE", "STATE", "WORKERS", "GPUS", "OWNER", "AGE")


def sandbox_row(obj: Mapping[str, Any], *, now: datetime | None = None) -> list[str]:
    meta = obj.get("metadata") or {}
    ready, desired = deployment_ready(obj)
    return [
        str(meta.get("name")),
        str(meta.get("namespace")),
        f"{ready}/{desired}",
        age(meta.get("creationTimestamp"), now=now),
    ]


SANDBOX_HEADERS = ("SANDBOX POOL", "NAMESPACE", "READY", "AGE")


def ray_job_row(job: Mapping[str, Any]) -> list[str]:
    def when(ms: Any) -> str:
        if not isinstance(ms, int | float) or not ms:
            return "-"
        return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")

    entry = str(job.get("entrypoint") or "")
    return [
        str(job.get("submission_id") or job.get("job_id") or "-"),
        str(job.get("status") or "-"),
        when(job.get("start_time")),
        when(job.get("end_time")),
        _one_line(entry, 60),
    ]


RAY_JOB_HEADERS = ("SUBMISSION ID", "STATUS", "START (UTC)", "END (UTC)", "ENTRYPOINT")


def pod_phase(pod: Mapping[str, Any]) -> str:
    """``Running``, ``Pending``, ... with ``not ready`` for a Running pod that is not Ready, and
    the waiting reason of a container that has one (``Pending ImagePullBackOff``)."""
    st = pod.get("status") or {}
    phase = str(st.get("phase") or "Unknown")
    reasons = [
        str((c.get("state") or {}).get("waiting", {}).get("reason"))
        for c in st.get("containerStatuses") or []
        if (c.get("state") or {}).get("waiting", {}).get("reason")
    ]
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])
    if phase == "Running" and not ready:
        phase = "Running, not ready"
    return f"{phase} {reasons[0]}" if reasons else phase


def ray_pod_lines(cluster: str, pods: Sequence[Mapping[str, Any]]) -> list[str]:
    """The head and worker pods of a RayCluster and their phases, as ``status`` prints them."""

    def name(p: Mapping[str, Any]) -> str:
        return str((p.get("metadata") or {}).get("name"))

    def labels(p: Mapping[str, Any]) -> Mapping[str, str]:
        return (p.get("metadata") or {}).get("labels") or {}

    heads = [p for p in pods if labels(p).get("ray.io/node-type") == "head"]
    workers = sorted(
        (p for p in pods if labels(p).get("ray.io/node-type") == "worker"),
        key=lambda p: (labels(p).get("ray.io/group", ""), name(p)),
    )
    out = [f"RayCluster {cluster} pods:"]
    out += [f"  head    {name(p)}  {pod_phase(p)}" for p in heads] or ["  head    -  (no pod yet)"]
    out += [
        f"  worker  {name(p)}  {pod_phase(p)}  group={labels(p).get('ray.io/group', '?')}" for p in workers
    ]
    if not workers:
        out.append("  worker  -  (no pod yet)")
    return out


def sandbox_pod_line(pool: str, pods: Sequence[Mapping[str, Any]]) -> str:
    counts: dict[str, int] = {}
    for p in pods:
        phase = pod_phase(p)
        counts[phase] = counts.get(phase, 0) + 1
    summary = ", ".join(f"{n} {phase}" for phase, n in sorted(counts.items())) or "no pods"
    return f"sandbox pool {pool} pods: {summary}"
