"""Opt-in namespace governance: ResourceQuota and LimitRange (rendered, never auto-applied)."""

from __future__ import annotations

from typing import Any

from nymph.dockyard import kube
from nymph.dockyard.schema import InfraConfig


def resource_quota(infra: InfraConfig) -> kube.Manifest:
    rq = infra.resourceQuota
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": kube.metadata(name=rq.name, namespace=infra.namespace, labels=kube.labels(infra.labels)),
        "spec": {"hard": dict(rq.hard)},
    }


def limit_range(infra: InfraConfig) -> kube.Manifest:
    lr = infra.limitRange
    item: dict[str, Any] = {"type": "Container"}
    for key in ("default", "defaultRequest", "max", "min"):
        values = getattr(lr, key)
        if values:
            item[key] = dict(values)
    return {
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": kube.metadata(name=lr.name, namespace=infra.namespace, labels=kube.labels(infra.labels)),
        "spec": {"limits": [item]},
    }
