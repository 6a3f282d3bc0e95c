"""What the live commands do with a rendered manifest list (pure).

* :func:`plan` splits the ordered list into what is never applied (render-only kinds), the
  pieces applied first (the sandbox pool, any PodDisruptionBudget, the DRA objects) and the Ray object
  (a RayJob or RayCluster) applied last;
* the names and label selectors KubeRay gives the objects it creates (head Service, head and
  worker Pods) and those of the sandbox pool.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from nymph.dockyard.render import k8s
from nymph.dockyard.render.manifests import RENDER_ONLY_KINDS

RAY_KINDS = frozenset({"RayJob", "RayCluster"})
#: KubeRay's labels on the Pods (and head Service) of a cluster.
CLUSTER_LABEL = "ray.io/cluster"
NODE_TYPE_LABEL = "ray.io/node-type"
GROUP_LABEL = "ray.io/group"
DASHBOARD_PORT = 8265
DASHBOARD_PORT_NAME = "dashboard"


class LogSource(StrEnum):
    HEAD = "head"
    WORKER = "worker"
    SANDBOX = "sandbox"


@dataclass(frozen=True)
class Plan:
    """An ordered manifest list split by what the live path does with each piece."""

    render_only: tuple[dict[str, Any], ...]
    first: tuple[dict[str, Any], ...]  # the sandbox pool, PDBs and DRA objects, in render order
    ray: dict[str, Any] | None  # the RayJob or RayCluster, applied last

    @property
    def applied(self) -> list[dict[str, Any]]:
        return [*self.first, *([self.ray] if self.ray is not None else [])]

    def sandbox_deployment(self) -> dict[str, Any] | None:
        return next((m for m in self.first if m["kind"] == "Deployment"), None)


def plan(manifests: Sequence[Mapping[str, Any]]) -> Plan:
    render_only: list[dict[str, Any]] = []
    first: list[dict[str, Any]] = []
    ray: dict[str, Any] | None = None
    for m in manifests:
        kind = m.get("kind")
        if kind in RENDER_ONLY_KINDS:
            render_only.append(dict(m))
        elif kind in RAY_KINDS:
            ray = dict(m)
        else:
            first.append(dict(m))
    return Plan(render_only=tuple(render_only), first=tuple(first), ray=ray)


def ref(manifest: Mapping[str, Any]) -> str:
    """``Kind/name`` of a manifest, for progress lines."""
    return f"{manifest.get('kind')}/{(manifest.get('metadata') or {}).get('name')}"


def head_service_name(cluster: str) -> str:
    """The head Service KubeRay creates for a RayCluster (``status.head.serviceName`` when
    the operator reports it)."""
    return f"{cluster}-head-svc"


def selector_text(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def ray_pod_selector(cluster: str, *, source: LogSource, group: str | None = None) -> str:
    labels = {CLUSTER_LABEL: cluster, NODE_TYPE_LABEL: source.value}
    if group is not None:
        labels[GROUP_LABEL] = group
    return selector_text(labels)


def sandbox_selector(deployment: Mapping[str, Any]) -> str:
    match = ((deployment.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    return selector_text(match)


def dashboard_port(service: Mapping[str, Any]) -> int:
    """The dashboard port of a head Service: the port named ``dashboard``, else 8265."""
    for port in (service.get("spec") or {}).get("ports") or []:
        if port.get("name") == DASHBOARD_PORT_NAME and isinstance(port.get("port"), int):
            return int(port["port"])
    return DASHBOARD_PORT


def in_cluster_url(service: str, *, namespace: str, port: int) -> str:
    return f"http://{service}.{namespace}.svc.cluster.local:{port}"


def is_sandbox_deployment(obj: Mapping[str, Any]) -> bool:
    """A Deployment rendered by dockyard as a sandbox pool (managed-by nymph, a container
    with ``DOCKYARD_FLEET_ROLE=sandbox``)."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    if labels.get(k8s.MANAGED_BY_KEY) != k8s.MANAGED_BY:
        return False
    pod = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
    return any(k8s.env_value(c, "DOCKYARD_FLEET_ROLE") == "sandbox" for c in pod.get("containers") or [])
