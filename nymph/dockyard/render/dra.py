"""Dynamic Resource Allocation for the GPU workers: a ComputeDomain and a RoCE
ResourceClaimTemplate for their well-known resource claims (pure), as dockyard-k8s renders them.

A worker group opts in by declaring, in its pod template's ``resourceClaims`` (authored in
``infra.kuberay.spec``), a claim named ``compute-domain-channel`` (an NVLink / IMEX channel of
NVIDIA's DRA driver) or ``roce-channel`` (RoCE RDMA NICs). With ``infra.dra.autoCreate`` (the
default) each such claim's ``resourceClaimTemplateName`` is rewritten to a name unique to the
cluster, ``compute-domain-<kuberay.name>`` / ``roce-<kuberay.name>``, and one object per distinct
claim is rendered before the Ray object:

* ``ComputeDomain`` (``resource.nvidia.com/v1beta1``) of that name, whose channel template has
  the same name (the driver's controller creates that ResourceClaimTemplate), ``numNodes`` from
  ``dra.computeDomainNumNodes`` (0: elastic);
* ``ResourceClaimTemplate`` (``resource.k8s.io/v1``) asking for exactly ``dra.roceCount``
  devices of the ``roce.networking.k8s.aws`` DeviceClass.

Only worker groups are read and rewritten (the head claims nothing), and only in the launch
modes that render a Ray object (rayjob, bringup). With ``autoCreate: false`` the claims pass
through untouched and nothing is rendered: the administrator provides the templates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nymph.dockyard.errors import DockyardConfigError
from nymph.dockyard.render import k8s
from nymph.dockyard.spec.schema import DRASpec, InfraConfig

COMPUTE_DOMAIN_CLAIM = "compute-domain-channel"
ROCE_CLAIM = "roce-channel"
COMPUTE_DOMAIN_API = "resource.nvidia.com/v1beta1"
RESOURCE_API = "resource.k8s.io/v1"
ROCE_DEVICE_CLASS = "roce.networking.k8s.aws"
ROCE_REQUEST = "roce"
#: well-known claim name -> (kind rendered for it, prefix of its cluster-unique name)
CLAIMS: Mapping[str, tuple[str, str]] = {
    COMPUTE_DOMAIN_CLAIM: ("ComputeDomain", "compute-domain-"),
    ROCE_CLAIM: ("ResourceClaimTemplate", "roce-"),
}
_SPEC = "infra.kuberay.spec.workerGroupSpecs"


@dataclass(frozen=True)
class DRAObject:
    """One object rendered for a well-known claim, and the worker groups that claim it."""

    claim: str
    kind: str
    name: str
    groups: tuple[str, ...]


def _claims(group: Mapping[str, Any], *, where: str) -> list[dict[str, Any]]:
    template = group.get("template")
    pod = template.get("spec") if isinstance(template, Mapping) else None
    claims = pod.get("resourceClaims") if isinstance(pod, Mapping) else None
    if claims is None:
        return []
    path = f"{where}.template.spec.resourceClaims"
    if not isinstance(claims, list):
        raise DockyardConfigError("expected a list of claims ({name, resourceClaimTemplateName})", path=path)
    for i, claim in enumerate(claims):
        if not isinstance(claim, dict) or not isinstance(claim.get("name"), str) or not claim["name"]:
            raise DockyardConfigError("expected a mapping with a name", path=f"{path}[{i}]")
    return claims


def _well_known(
    groups: Sequence[Mapping[str, Any]], *, autocreate: bool
) -> list[tuple[str, str, dict[str, Any]]]:
    """(group name, key path, claim) of every well-known claim of the worker groups."""
    out: list[tuple[str, str, dict[str, Any]]] = []
    for i, group in enumerate(groups):
        where = f"{_SPEC}[{i}]"
        for j, claim in enumerate(_claims(group, where=where)):
            if claim["name"] not in CLAIMS:
                continue
            path = f"{where}.template.spec.resourceClaims[{j}]"
            if autocreate and "resourceClaimName" in claim:
                raise DockyardConfigError(
                    f"claim {claim['name']!r} is rendered from a template (infra.dra.autoCreate): "
                    "drop resourceClaimName, or set infra.dra.autoCreate: false to use your own claim",
                    path=path,
                )
            out.append((str(group.get("groupName", "")), path, claim))
    return out


def planned(infra: InfraConfig) -> list[DRAObject]:
    """The DRA objects ``infra`` renders (none without ``autoCreate`` or a GPU cluster)."""
    cluster = infra.kuberay
    if cluster is None or not infra.dra.autoCreate:
        return []
    groups = cluster.spec.get("workerGroupSpecs")
    if not isinstance(groups, list):
        return []
    by_claim: dict[str, list[str]] = {}
    for group, _, claim in _well_known([g for g in groups if isinstance(g, Mapping)], autocreate=True):
        names = by_claim.setdefault(claim["name"], [])
        if group not in names:
            names.append(group)
    out: list[DRAObject] = []
    for claim_name, names in by_claim.items():
        kind, prefix = CLAIMS[claim_name]
        out.append(
            DRAObject(claim=claim_name, kind=kind, name=f"{prefix}{cluster.name}", groups=tuple(names))
        )
    return out


def passed_through(infra: InfraConfig) -> list[str]:
    """The well-known claims of the worker groups left as authored (``autoCreate: false``)."""
    cluster = infra.kuberay
    groups = cluster.spec.get("workerGroupSpecs") if cluster is not None else None
    if infra.dra.autoCreate or not isinstance(groups, list):
        return []
    found = _well_known([g for g in groups if isinstance(g, Mapping)], autocreate=False)
    return list(dict.fromkeys(claim["name"] for _, _, claim in found))


def rewrite_claims(groups: Sequence[Mapping[str, Any]], *, cluster: str, dra: DRASpec) -> None:
    """Point each well-known claim of the worker groups at its cluster-unique template, in
    place (nothing with ``autoCreate: false``)."""
    if not dra.autoCreate:
        return
    for _, _, claim in _well_known(groups, autocreate=True):
        claim["resourceClaimTemplateName"] = f"{CLAIMS[claim['name']][1]}{cluster}"


def compute_domain(name: str, *, namespace: str, num_nodes: int) -> k8s.Manifest:
    return {
        "apiVersion": COMPUTE_DOMAIN_API,
        "kind": "ComputeDomain",
        "metadata": k8s.metadata(name=name, namespace=namespace, labels=k8s.labels()),
        "spec": {"channel": {"resourceClaimTemplate": {"name": name}}, "numNodes": num_nodes},
    }


def roce_template(name: str, *, namespace: str, count: int) -> k8s.Manifest:
    request = {"name": ROCE_REQUEST, "exactly": {"deviceClassName": ROCE_DEVICE_CLASS, "count": count}}
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaimTemplate",
        "metadata": k8s.metadata(name=name, namespace=namespace, labels=k8s.labels()),
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def manifests(infra: InfraConfig) -> list[k8s.Manifest]:
    """The DRA objects of ``infra`` in claim order (see the module docstring)."""
    out: list[k8s.Manifest] = []
    for obj in planned(infra):
        if obj.kind == "ComputeDomain":
            out.append(
                compute_domain(obj.name, namespace=infra.namespace, num_nodes=infra.dra.computeDomainNumNodes)
            )
        else:
            out.append(roce_template(obj.name, namespace=infra.namespace, count=infra.dra.roceCount))
    return out
