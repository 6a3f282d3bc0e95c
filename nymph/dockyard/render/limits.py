"""How many pods a rendered dockyard launch asks for, against an operator's cap (pure).

Counted on the rendered manifests, so that every way of asking (``sandbox.replicas``, a
free-form ``sandbox.spec.replicas``, worker groups of ``kuberay.spec`` before or after
segmenting) is counted the same:

* every ``replicas``, ``minReplicas`` and ``maxReplicas`` of a worker group (RayJob,
  RayCluster, RayService) and the ``replicas`` of a Deployment, StatefulSet or ReplicaSet is an
  integer of at most the cap;
* the workers of one Ray cluster, ``max(replicas, maxReplicas) * numOfHosts`` summed over its
  worker groups, are at most the cap too (a big group split into segments counts whole).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nymph.dockyard.errors import DockyardConfigError

_SCALED = ("Deployment", "StatefulSet", "ReplicaSet")
_RAY_CLUSTER_AT = {"RayCluster": (), "RayJob": ("rayClusterSpec",), "RayService": ("rayClusterConfig",)}
_GROUP_FIELDS = ("replicas", "minReplicas", "maxReplicas")


class ReplicaLimitError(DockyardConfigError):
    """A rendered launch asks for more pods than the operator allows (or for a non-integer)."""


@dataclass(frozen=True, kw_only=True)
class ReplicaCap:
    """The cap and the operator setting that raises it (named in every refusal)."""

    max_replicas: int
    setting: str = "--max-replicas"


def _count(value: object, *, path: str, cap: ReplicaCap) -> int:
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ReplicaLimitError("expected a non-negative integer", path=path)
    if value > cap.max_replicas:
        raise ReplicaLimitError(
            f"{value} is more than the {cap.max_replicas} replicas allowed here (the queue's {cap.setting})",
            path=path,
        )
    return value


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _worker_groups(manifest: Mapping[str, Any], name: str) -> tuple[str, list[Mapping[str, Any]]]:
    """The path of a Ray kind's ``workerGroupSpecs`` and its groups."""
    at = f"{name} spec"
    cluster = _mapping(manifest.get("spec"))
    for key in _RAY_CLUSTER_AT[str(manifest.get("kind"))]:
        at, cluster = f"{at}.{key}", _mapping(cluster.get(key))
    groups = cluster.get("workerGroupSpecs")
    return f"{at}.workerGroupSpecs", [_mapping(g) for g in (groups if isinstance(groups, list) else [])]


def check_replicas(manifests: Sequence[Mapping[str, Any]], *, cap: ReplicaCap, prefix: str = "") -> None:
    """Refuse ``manifests`` asking for more pods than ``cap`` allows (see the module docstring).

    Raises :class:`ReplicaLimitError` whose path is ``prefix`` + ``KIND/NAME FIELD.PATH``.
    """
    for manifest in manifests:
        kind = manifest.get("kind")
        name = f"{prefix}{kind}/{_mapping(manifest.get('metadata')).get('name')}"
        if kind in _SCALED:
            _count(_mapping(manifest.get("spec")).get("replicas"), path=f"{name} spec.replicas", cap=cap)
        if kind not in _RAY_CLUSTER_AT:
            continue
        total = 0
        groups_at, groups = _worker_groups(manifest, name)
        for i, group in enumerate(groups):
            at = f"{groups_at}[{i}]"
            counts = [_count(group.get(f), path=f"{at}.{f}", cap=cap) for f in _GROUP_FIELDS]
            hosts = group.get("numOfHosts", 1)
            hosts = _count(hosts, path=f"{at}.numOfHosts", cap=cap) if hosts is not None else 1
            total += max(counts[0], counts[2]) * max(hosts, 1)
        if total > cap.max_replicas:
            raise ReplicaLimitError(
                f"the worker groups ask for {total} pods in all, more than the {cap.max_replicas} "
                f"allowed here (the queue's {cap.setting})",
                path=groups_at,
            )
