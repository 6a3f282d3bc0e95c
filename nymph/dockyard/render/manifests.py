"""Recipe + infra -> manifests in apply order (pure and deterministic).

Order:

1. ResourceQuota, LimitRange (when enabled; rendered only — the live path never applies
   them);
2. the sandbox pool: Deployment, Service, NetworkPolicy, PodDisruptionBudget (when
   ``sandbox`` is set; the last two when enabled);
3. the GPU cluster's PodDisruptionBudget (``kuberay.pdb.enabled``, bringup only: a RayJob's
   cluster name is chosen by KubeRay);
4. the DRA objects the workers' well-known resource claims need (a ComputeDomain, a RoCE
   ResourceClaimTemplate: :mod:`nymph.dockyard.render.dra`), rayjob and bringup only, so they
   exist before the workers are scheduled;
5. a RayJob (``launch.mode: rayjob``), a RayCluster (``bringup``) or nothing (``attach``).

Every GPU pod gets ``RAY_ENABLE_UV_RUN_RUNTIME_ENV=0`` and, with ``sandbox.injectUrls``,
``DOCKYARD_SANDBOX_URLS`` (the sandbox Service DNS). The same infra always renders
byte-identical YAML.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nymph.dockyard.errors import DockyardConfigError
from nymph.dockyard.render import dra, governance, hardening, k8s, raycluster, sandbox
from nymph.dockyard.spec.enums import LaunchMode
from nymph.dockyard.spec.schema import InfraConfig
from nymph.launch.render import to_yaml_stream

#: Kinds the live path never applies (namespace governance is an admin's call).
RENDER_ONLY_KINDS = frozenset({"ResourceQuota", "LimitRange"})


def cross_env(infra: InfraConfig) -> dict[str, str]:
    """The env injected into every GPU pod."""
    env = {raycluster.UV_ENV: "0"}
    if infra.sandbox is not None and infra.sandbox.injectUrls:
        env[raycluster.SANDBOX_URLS_ENV] = sandbox.service_url(infra.sandbox, namespace=infra.namespace)
    return env


def render_manifests(*, infra: InfraConfig, max_runtime: int | None = None) -> list[k8s.Manifest]:
    """The ordered manifest list of one deployment (see the module docstring). ``max_runtime``
    (seconds) becomes a RayJob's ``spec.activeDeadlineSeconds``; None leaves the output as it
    was."""
    out: list[k8s.Manifest] = []
    if infra.resourceQuota.enabled:
        out.append(governance.resource_quota(infra))
    if infra.limitRange.enabled:
        out.append(governance.limit_range(infra))
    if infra.sandbox is not None:
        out.extend(sandbox.manifests(infra.sandbox, infra))
    mode = infra.launch.mode
    cluster = infra.kuberay
    if mode is LaunchMode.BRINGUP and cluster is not None and cluster.pdb.enabled:
        out.append(
            hardening.pod_disruption_budget(
                name=f"{cluster.name}-pdb",
                namespace=infra.namespace,
                selector={"ray.io/cluster": cluster.name},
                spec=cluster.pdb,
                labels=k8s.labels(infra.labels, cluster.labels),
            )
        )
    if mode in (LaunchMode.RAYJOB, LaunchMode.BRINGUP):
        out.extend(dra.manifests(infra))
    if mode is LaunchMode.RAYJOB:
        out.append(raycluster.rayjob(infra, cross_env=cross_env(infra), max_runtime=max_runtime))
    elif mode is LaunchMode.BRINGUP:
        out.append(raycluster.raycluster(infra, cross_env=cross_env(infra)))
    _check_unique(out)
    return [plain_manifest(m) for m in out]


def plain_manifest(manifest: k8s.Manifest) -> k8s.Manifest:
    result: k8s.Manifest = k8s.plain(manifest)
    return result


def _check_unique(manifests: Sequence[k8s.Manifest]) -> None:
    seen: set[tuple[str, str]] = set()
    for m in manifests:
        key = (m["kind"], m["metadata"]["name"])
        if key in seen:
            raise DockyardConfigError(
                f"two {key[0]} objects named {key[1]!r} (rename sandbox.name or kuberay.name)",
                path="infra",
            )
        seen.add(key)


def to_yaml(manifests: Sequence[Any]) -> str:
    """Multi-document YAML in the given order."""
    return to_yaml_stream(list(manifests))
