"""How many pods a rendered dockyard launch asks for, and how much each, against an operator's
caps (pure).

Counted on the rendered manifests, so that every way of asking (``sandbox.replicas``, a
free-form ``sandbox.spec.replicas``, worker groups of ``kuberay.spec`` before or after
segmenting) is counted the same:

* every ``replicas``, ``minReplicas`` and ``maxReplicas`` of a worker group (RayJob,
  RayCluster, RayService) and the ``replicas`` of a Deployment, StatefulSet or ReplicaSet is an
  integer of at most the cap;
* the workers of one Ray cluster, ``max(replicas, maxReplicas) * numOfHosts`` summed over its
  worker groups, are at most the cap too (a big group split into segments counts whole);
* every pod template asks for at most the per-pod cap of each capped resource
  (:func:`check_requests`), counted as the scheduler does: a container's requests (its limits
  where it states no request), summed over the containers, or the largest init container's
  when that is more.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from nymph.dockyard.errors import DockyardConfigError
from nymph.launch.placement import QuantityError, format_quantity, parse_quantity
from nymph.launch.podpolicy import pod_templates

_SCALED = ("Deployment", "StatefulSet", "ReplicaSet")
_RAY_CLUSTER_AT = {"RayCluster": (), "RayJob": ("rayClusterSpec",), "RayService": ("rayClusterConfig",)}
_GROUP_FIELDS = ("replicas", "minReplicas", "maxReplicas")


class ReplicaLimitError(DockyardConfigError):
    """A rendered launch asks for more pods than the operator allows (or for a non-integer)."""


class RequestLimitError(DockyardConfigError):
    """A pod of a rendered launch asks for more of a resource than the operator allows."""


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


@dataclass(frozen=True, kw_only=True)
class RequestCaps:
    """The most of each resource one pod may request (``cpu``, ``memory``, ``nvidia.com/gpu``),
    and the operator setting that sets them."""

    max_per_pod: Mapping[str, Fraction] = field(default_factory=dict)
    setting: str = "--max-pod-request"


def _container_requests(container: Mapping[str, Any], at: str) -> dict[str, tuple[Fraction, str]]:
    """resource -> (quantity, field path) of one container: requests, else limits."""
    resources = _mapping(container.get("resources"))
    out: dict[str, tuple[Fraction, str]] = {}
    for kind in ("limits", "requests"):  # requests win where both are given
        for resource, value in _mapping(resources.get(kind)).items():
            path = f"{at}.resources.{kind}.{resource}"
            try:
                out[str(resource)] = (parse_quantity(value), path)
            except QuantityError as exc:
                raise RequestLimitError(str(exc), path=path) from None
    return out


def _over(value: Fraction, cap: Fraction, resource: str, caps: RequestCaps, what: str) -> str | None:
    if value <= cap:
        return None
    return (
        f"{what} {format_quantity(value, resource=resource)} {resource}, more than the "
        f"{format_quantity(cap, resource=resource)} one pod may request here (the queue's {caps.setting})"
    )


def check_requests(manifests: Sequence[Mapping[str, Any]], *, caps: RequestCaps, prefix: str = "") -> None:
    """Refuse a pod template asking for more of a capped resource than ``caps`` allows.

    Raises :class:`RequestLimitError` naming the container's field (or the pod's containers,
    when only their sum is over) as ``prefix`` + ``KIND/NAME FIELD.PATH``.
    """
    if not caps.max_per_pod:
        return
    for template in pod_templates(manifests):
        where = prefix + template.where
        totals: dict[str, Fraction] = {}
        for kind in ("initContainers", "containers"):
            containers = template.spec.get(kind)
            for i, container in enumerate(containers if isinstance(containers, list) else []):
                at = f"{where}.{kind}[{i}]"
                for resource, (value, path) in _container_requests(_mapping(container), at).items():
                    cap = caps.max_per_pod.get(resource)
                    problem = None if cap is None else _over(value, cap, resource, caps, "asks for")
                    if problem:
                        raise RequestLimitError(problem, path=path)
                    if kind == "containers":
                        totals[resource] = totals.get(resource, Fraction(0)) + value
        for resource, total in totals.items():
            cap = caps.max_per_pod.get(resource)
            problem = None if cap is None else _over(total, cap, resource, caps, "the containers ask for")
            if problem:
                raise RequestLimitError(problem, path=f"{where}.containers")
