"""Opt-in namespace governance: ResourceQuota and LimitRange (rendered, never auto-applied)."""

from __future__ import annotations

from typing import Any

from nymph.dockyard.render import k8s
from nymph.dockyard.spec.schema import InfraConfig


def resource_quota(infra: InfraConfig) -> k8s.Manifest:
    rq = infra.resourceQuota
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": k8s.metadata(name=rq.name, namespace=infra.namespace, labels=k8s.labels(infra.labels)),
        "spec": {"hard": dict(rq.hard)},
    }


def limit_range(infra: InfraConfig) -> k8s.Manifest:
    lr = infra.limitRange
    item: dict[str, Any] = {"type": "Container"}
    for key in ("default", "defaultRequest", "max", "min"):
        values = getattr(lr, key)
        if values:
            item[key] = dict(values)
    return {
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": k8s.metadata(name=lr.name, namespace=infra.namespace, labels=k8s.labels(infra.labels)),
        "spec": {"limits": [item]},
    }
