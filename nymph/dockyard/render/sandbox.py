"""The sandbox executor pool: a GPU-free Deployment behind a ClusterIP Service.

Without ``sandbox.spec`` a complete Deployment is synthesized: one ``task-executor``
container (``DOCKYARD_FLEET_ROLE=sandbox``, ``API_PORT``, TCP probes on the port), small
requests with limits defaulting to the requests, hardening from ``sandbox.security`` (and no
service-account token while it is enabled), the top-level image / pull secrets / service
account / priority class, and ``sandbox.topologySpreadConstraints``.

With ``sandbox.spec`` (an inline Deployment ``.spec``) the authored spec is kept and the same
cross-cutting fields are filled in where it leaves them unset.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from nymph.dockyard.errors import DockyardConfigError
from nymph.dockyard.render import hardening, k8s
from nymph.dockyard.spec.schema import InfraConfig, PodResources, SandboxSpec

CONTAINER_NAME = "task-executor"
ROLE_ENV = "DOCKYARD_FLEET_ROLE"
PORT_ENV = "API_PORT"
SANDBOX_ROLE = "sandbox"


def selector(sandbox: SandboxSpec) -> dict[str, str]:
    return {k8s.NAME_KEY: sandbox.name}


def service_url(sandbox: SandboxSpec, *, namespace: str) -> str:
    """The in-cluster URL of the pool, as injected into ``DOCKYARD_SANDBOX_URLS``."""
    return f"http://{sandbox.name}.{namespace}.svc.cluster.local:{sandbox.port}"


def object_labels(sandbox: SandboxSpec, infra: InfraConfig) -> dict[str, str]:
    return k8s.labels(infra.labels, sandbox.labels)


def resources(res: PodResources) -> dict[str, Any]:
    """Requests from ``cpu`` / ``memory`` / ``ephemeralStorage``; each limit defaults to its
    request unless its ``*Limit`` is set."""
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    for key, limit_key, name in (
        ("cpu", "cpuLimit", "cpu"),
        ("memory", "memoryLimit", "memory"),
        ("ephemeralStorage", "ephemeralStorageLimit", "ephemeral-storage"),
    ):
        request = getattr(res, key)
        limit = getattr(res, limit_key)
        if request is not None:
            requests[name] = request
        if limit is not None or request is not None:
            limits[name] = limit if limit is not None else request
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def _env(sandbox: SandboxSpec) -> dict[str, str]:
    env = {ROLE_ENV: SANDBOX_ROLE, PORT_ENV: str(sandbox.port)}
    for name, value in sandbox.env.items():
        if name == ROLE_ENV and value != SANDBOX_ROLE:
            raise DockyardConfigError(
                f"{ROLE_ENV} of the sandbox pool is always {SANDBOX_ROLE!r}",
                path=f"infra.sandbox.env.{ROLE_ENV}",
            )
        env[name] = value
    return env


def _probe(port: int, *, initial: int, period: int, failures: int) -> dict[str, Any]:
    return {
        "tcpSocket": {"port": port},
        "initialDelaySeconds": initial,
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def _cross_cutting(pod_spec: dict[str, Any], infra: InfraConfig, *, force: bool) -> None:
    if infra.imagePullSecrets:
        known = k8s.names_of(pod_spec.get("imagePullSecrets") or [])
        pod_spec["imagePullSecrets"] = [
            *(pod_spec.get("imagePullSecrets") or []),
            *({"name": s} for s in infra.imagePullSecrets if s not in known),
        ]
    if infra.serviceAccount is not None:
        pod_spec["serviceAccountName"] = infra.serviceAccount
    if infra.priorityClassName is not None:
        if force:
            pod_spec["priorityClassName"] = infra.priorityClassName
        else:
            pod_spec.setdefault("priorityClassName", infra.priorityClassName)


def _synthesized_pod(sandbox: SandboxSpec, infra: InfraConfig) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": infra.image,
        "ports": [{"name": "http", "containerPort": sandbox.port, "protocol": "TCP"}],
        "env": k8s.env_list(_env(sandbox)),
        "readinessProbe": _probe(sandbox.port, initial=10, period=10, failures=6),
        "livenessProbe": _probe(sandbox.port, initial=30, period=20, failures=3),
    }
    res = resources(sandbox.resources)
    if res:
        container["resources"] = res
    pod_sc, container_sc = hardening.security_contexts(sandbox.security)
    if container_sc:
        container["securityContext"] = container_sc
    pod_spec: dict[str, Any] = {"containers": [container]}
    if pod_sc:
        pod_spec["securityContext"] = pod_sc
    if sandbox.security.enabled:
        pod_spec["automountServiceAccountToken"] = False
    _cross_cutting(pod_spec, infra, force=True)
    if sandbox.topologySpreadConstraints:
        pod_spec["topologySpreadConstraints"] = k8s.plain(sandbox.topologySpreadConstraints)
    return pod_spec


def _patched_spec(sandbox: SandboxSpec, infra: InfraConfig) -> dict[str, Any]:
    spec: dict[str, Any] = copy.deepcopy(dict(sandbox.spec or {}))
    template = spec.setdefault("template", {})
    pod_spec = template.setdefault("spec", {}) if isinstance(template, dict) else None
    containers = pod_spec.get("containers") if isinstance(pod_spec, dict) else None
    if not isinstance(pod_spec, dict) or not isinstance(containers, list) or not containers:
        raise DockyardConfigError(
            "an inline Deployment spec needs template.spec.containers (a non-empty list)",
            path="infra.sandbox.spec.template.spec.containers",
        )
    pod_sc, container_sc = hardening.security_contexts(sandbox.security)
    for i, container in enumerate(containers):
        if not isinstance(container, dict):
            raise DockyardConfigError(
                "expected a mapping", path=f"infra.sandbox.spec.template.spec.containers[{i}]"
            )
        container.setdefault("image", infra.image)
        k8s.env_upsert(container, {ROLE_ENV: SANDBOX_ROLE})
        if container_sc:
            container.setdefault("securityContext", copy.deepcopy(container_sc))
    if pod_sc:
        pod_spec.setdefault("securityContext", pod_sc)
    if sandbox.security.enabled:
        pod_spec.setdefault("automountServiceAccountToken", False)
    _cross_cutting(pod_spec, infra, force=False)
    if sandbox.topologySpreadConstraints:
        pod_spec.setdefault("topologySpreadConstraints", k8s.plain(sandbox.topologySpreadConstraints))
    spec.setdefault("replicas", sandbox.replicas)
    return spec


def deployment(sandbox: SandboxSpec, infra: InfraConfig) -> k8s.Manifest:
    sel = selector(sandbox)
    pod_labels = {**object_labels(sandbox, infra), **sel}
    if sandbox.spec is None:
        spec: dict[str, Any] = {
            "replicas": sandbox.replicas,
            "selector": {"matchLabels": sel},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": _synthesized_pod(sandbox, infra),
            },
        }
    else:
        spec = _patched_spec(sandbox, infra)
        spec.setdefault("selector", {"matchLabels": sel})
        meta = spec["template"].setdefault("metadata", {})
        meta["labels"] = {**pod_labels, **(meta.get("labels") or {}), **sel}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": k8s.metadata(
            name=sandbox.name,
            namespace=infra.namespace,
            labels=object_labels(sandbox, infra),
            annotations={**infra.annotations, **sandbox.annotations},
        ),
        "spec": spec,
    }


def service(sandbox: SandboxSpec, infra: InfraConfig) -> k8s.Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": k8s.metadata(
            name=sandbox.name, namespace=infra.namespace, labels=object_labels(sandbox, infra)
        ),
        "spec": {
            "type": "ClusterIP",
            "selector": selector(sandbox),
            "ports": [{"name": "http", "port": sandbox.port, "targetPort": sandbox.port, "protocol": "TCP"}],
        },
    }


def manifests(sandbox: SandboxSpec, infra: InfraConfig) -> list[k8s.Manifest]:
    """Deployment, Service, then the NetworkPolicy and PDB when enabled."""
    out = [deployment(sandbox, infra), service(sandbox, infra)]
    labels: Mapping[str, str] = object_labels(sandbox, infra)
    if sandbox.networkPolicy.enabled:
        out.append(
            hardening.network_policy(
                name=f"{sandbox.name}-netpol",
                namespace=infra.namespace,
                selector=selector(sandbox),
                port=sandbox.port,
                spec=sandbox.networkPolicy,
                labels=labels,
            )
        )
    if sandbox.pdb.enabled:
        out.append(
            hardening.pod_disruption_budget(
                name=f"{sandbox.name}-pdb",
                namespace=infra.namespace,
                selector=selector(sandbox),
                spec=sandbox.pdb,
                labels=labels,
            )
        )
    return out
