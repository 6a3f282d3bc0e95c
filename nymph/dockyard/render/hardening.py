"""Hardening pieces: security contexts, the sandbox NetworkPolicy, PodDisruptionBudgets.

Defaults are ON for the sandbox pool and OFF for the GPU fleets (see the schema); every
piece is dropped when its ``enabled`` is false.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nymph.dockyard.render import k8s
from nymph.dockyard.spec.schema import NetworkPolicySpec, PDBSpec, SecuritySpec

DNS_PORT = 53


def security_contexts(sec: SecuritySpec) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(pod securityContext, container securityContext)``; both empty when disabled.

    Pod level carries identity (``runAs*``, ``fsGroup``) and the seccomp profile; container
    level the privilege / capability / root-filesystem settings. ``runAsNonRoot`` (opt-in)
    and the seccomp profile go on both so every container is covered.
    """
    if not sec.enabled:
        return {}, {}
    pod: dict[str, Any] = {}
    container: dict[str, Any] = {}
    if sec.runAsNonRoot is not None:
        pod["runAsNonRoot"] = sec.runAsNonRoot
        container["runAsNonRoot"] = sec.runAsNonRoot
    for key in ("runAsUser", "runAsGroup", "fsGroup"):
        value = getattr(sec, key)
        if value is not None:
            pod[key] = value
    if sec.seccompProfile is not None:
        pod["seccompProfile"] = {"type": sec.seccompProfile}
        container["seccompProfile"] = {"type": sec.seccompProfile}
    container["allowPrivilegeEscalation"] = sec.allowPrivilegeEscalation
    caps: dict[str, list[str]] = {}
    if sec.dropCapabilities:
        caps["drop"] = list(sec.dropCapabilities)
    if sec.addCapabilities:
        caps["add"] = list(sec.addCapabilities)
    if caps:
        container["capabilities"] = caps
    if sec.readOnlyRootFilesystem is not None:
        container["readOnlyRootFilesystem"] = sec.readOnlyRootFilesystem
    return pod, container


def network_policy(
    *,
    name: str,
    namespace: str,
    selector: Mapping[str, str],
    port: int,
    spec: NetworkPolicySpec,
    labels: Mapping[str, str],
) -> k8s.Manifest:
    """Ingress only on ``port`` from this namespace (or ``fromLabels`` pods); DNS egress
    always; other egress open, or only to ``allowedEgressCidrs`` when ``allowEgress`` is
    false."""
    peer: dict[str, Any] = (
        {"podSelector": {"matchLabels": dict(spec.fromLabels)}} if (spec.fromLabels) else {"podSelector": {}}
    )
    ingress = [{"from": [peer], "ports": [{"protocol": "TCP", "port": port}]}]
    egress: list[dict[str, Any]] = [
        {"ports": [{"protocol": "UDP", "port": DNS_PORT}, {"protocol": "TCP", "port": DNS_PORT}]}
    ]
    if spec.allowEgress:
        egress.append({})
    elif spec.allowedEgressCidrs:
        egress.append({"to": [{"ipBlock": {"cidr": c}} for c in spec.allowedEgressCidrs]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": k8s.metadata(name=name, namespace=namespace, labels=labels),
        "spec": {
            "podSelector": {"matchLabels": dict(selector)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": ingress,
            "egress": egress,
        },
    }


def pod_disruption_budget(
    *,
    name: str,
    namespace: str,
    selector: Mapping[str, str],
    spec: PDBSpec,
    labels: Mapping[str, str],
) -> k8s.Manifest:
    body: dict[str, Any] = {"selector": {"matchLabels": dict(selector)}}
    if spec.minAvailable is not None:
        body["minAvailable"] = spec.minAvailable
    if spec.maxUnavailable is not None:
        body["maxUnavailable"] = spec.maxUnavailable
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": k8s.metadata(name=name, namespace=namespace, labels=labels),
        "spec": body,
    }
