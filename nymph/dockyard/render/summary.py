"""``check`` output: a one-page summary, or the fully resolved bundle (pure)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from nymph.dockyard.render import dra as draobjects
from nymph.dockyard.render import fleets, k8s, raycluster, sandbox
from nymph.dockyard.render.manifests import RENDER_ONLY_KINDS
from nymph.dockyard.spec.enums import LaunchMode
from nymph.dockyard.spec.load import LoadedConfig
from nymph.dockyard.spec.schema import InfraConfig, SecuritySpec
from nymph.launch.render import to_yaml

_W = 12


def _line(key: str, value: str) -> str:
    return f"{key + ':':<{_W}} {value}"


def _ray_spec(manifests: Sequence[k8s.Manifest]) -> dict[str, Any] | None:
    for m in manifests:
        if m["kind"] == "RayJob":
            spec: dict[str, Any] = m["spec"]["rayClusterSpec"]
            return spec
        if m["kind"] == "RayCluster":
            return m["spec"]
    return None


def _gpus(group: Mapping[str, Any]) -> str:
    params = group.get("rayStartParams") or {}
    if "num-gpus" in params:
        return str(params["num-gpus"])
    containers = group.get("template", {}).get("spec", {}).get("containers") or [{}]
    limits = (containers[0].get("resources") or {}).get("limits") or {}
    return str(limits.get("nvidia.com/gpu", 0))


def _worker_lines(spec: Mapping[str, Any]) -> list[str]:
    out = []
    for group in spec.get("workerGroupSpecs") or []:
        containers = group["template"]["spec"]["containers"]
        role = k8s.env_value(containers[0], fleets.ROLE_ENV) or "none"
        out.append(
            f"  {group['groupName']:<20} role={role:<9} replicas={group.get('replicas', '?')} "
            f"gpus/pod={_gpus(group)}"
        )
    return out


def _inferred_lines(infra: InfraConfig) -> list[str]:
    """What the render inferred: each worker group's fleet role and where it comes from, and
    the DRA objects rendered for the workers' claims (or the claims left as authored)."""
    assert infra.kuberay is not None
    out = ["inferred:"]
    roles = raycluster.group_roles(infra.kuberay)
    for found in roles:
        if found.role is None:
            out.append(
                f"  {found.group}: a plain Ray worker group ({found.source}): no "
                f"{fleets.TAG_PREFIX}* tag, no {fleets.ROLE_ENV}"
            )
        else:
            out.append(f"  {found.group}: fleet role {found.role} (from {found.source})")
    missing = [r for r in fleets.ROLES if all(found.role != r for found in roles)]
    if missing:
        out.append(f"  fleets: no {' and no '.join(missing)} worker group")
    dra = infra.dra
    for obj in draobjects.planned(infra):
        what = (
            f"numNodes={dra.computeDomainNumNodes}" + (", elastic" if not dra.computeDomainNumNodes else "")
            if obj.kind == "ComputeDomain"
            else f"{dra.roceCount} RoCE NICs per pod"
        )
        out.append(
            f"  dra: {obj.kind}/{obj.name} ({what}) for claim {obj.claim} of "
            f"{', '.join(obj.groups)} (template name rewritten)"
        )
    passed = draobjects.passed_through(infra)
    if passed:
        out.append(f"  dra: autoCreate off: claims {', '.join(passed)} left as authored, no DRA objects")
    return out


def _hardening(sec: SecuritySpec) -> str:
    if not sec.enabled:
        return "off"
    parts = ["no privilege escalation" if not sec.allowPrivilegeEscalation else "escalation allowed"]
    if sec.dropCapabilities:
        parts.append(f"drop {','.join(sec.dropCapabilities)}")
    if sec.seccompProfile:
        parts.append(f"seccomp {sec.seccompProfile}")
    if sec.runAsNonRoot:
        parts.append("runAsNonRoot")
    return "on (" + ", ".join(parts) + ")"


def _sandbox_lines(infra: InfraConfig) -> list[str]:
    sb = infra.sandbox
    if sb is None:
        return [_line("sandbox", f"none (external: set {raycluster.SANDBOX_URLS_ENV} in launch.env)")]
    res = sandbox.resources(sb.resources)
    req = " ".join(f"{k}={v}" for k, v in (res.get("requests") or {}).items()) or "-"
    lim = " ".join(f"{k}={v}" for k, v in (res.get("limits") or {}).items()) or "-"
    url = sandbox.service_url(sb, namespace=infra.namespace)
    if not sb.injectUrls:
        inject = "not injected (injectUrls: false)"
    elif infra.launch.mode is LaunchMode.ATTACH:
        inject = f"not injected in attach mode (set {raycluster.SANDBOX_URLS_ENV} in launch.env)"
    else:
        inject = f"injected as {raycluster.SANDBOX_URLS_ENV} into every GPU pod"
    np = sb.networkPolicy
    if not np.enabled:
        net = "off"
    elif np.allowEgress:
        net = f"ingress TCP {sb.port} from the namespace; egress open"
    else:
        cidrs = ", ".join(np.allowedEgressCidrs) or "none"
        net = f"ingress TCP {sb.port} from the namespace; egress DNS + {cidrs}"
    pdb = sb.pdb
    pdb_text = (
        "off"
        if not pdb.enabled
        else (
            f"maxUnavailable={pdb.maxUnavailable}"
            if pdb.maxUnavailable is not None
            else f"minAvailable={pdb.minAvailable}"
        )
    )
    return [
        _line("sandbox", f"{sb.name}  replicas={sb.replicas}  port={sb.port}"),
        f"  url:       {url}  ({inject})",
        f"  requests:  {req}   limits: {lim}",
        f"  security:  {_hardening(sb.security)}",
        f"  netpol:    {net}",
        f"  pdb:       {pdb_text}",
    ]


def _namespace_origin(source: str) -> str:
    if source == "infra":
        return "set in the infra"
    if source == "fallback":
        return "fallback: no namespace in the kube context, no service account"
    return f"from the {source}"


def summary(loaded: LoadedConfig, manifests: Sequence[k8s.Manifest]) -> str:
    infra = loaded.infra
    lines = [
        _line("recipe", str(loaded.recipe_path)),
        _line("infra", loaded.infra_source),
        _line("namespace", f"{infra.namespace}  ({_namespace_origin(loaded.namespace_source)})"),
        _line(
            "image",
            infra.image
            + (f"  (pull secrets: {', '.join(infra.imagePullSecrets)})" if infra.imagePullSecrets else ""),
        ),
    ]
    if infra.serviceAccount:
        lines.append(_line("account", infra.serviceAccount))
    if infra.priorityClassName:
        lines.append(_line("priority", infra.priorityClassName))
    sched = infra.scheduler
    lines.append(_line("scheduler", sched.kind.value + (f"  (queue={sched.queue})" if sched.queue else "")))
    launch = infra.launch
    lines.append(
        _line(
            "launch",
            f"mode={launch.mode.value} runMode={launch.runMode.value} "
            f"codeSource={launch.codeSource.value}"
            + (f" codePath={launch.codePath}" if launch.codePath else ""),
        )
    )
    if launch.mode is LaunchMode.ATTACH:
        lines.append(_line("cluster", f"attach to existing RayCluster {launch.attach}"))
    spec = _ray_spec(manifests)
    if spec is not None and infra.kuberay is not None:
        lines.append(_line("cluster", f"{infra.kuberay.name}  rayVersion={spec.get('rayVersion', '-')}"))
        lines.append(
            _line(
                "gpu pods",
                f"security {_hardening(infra.security)}; pdb "
                + ("on" if infra.kuberay.pdb.enabled else "off"),
            )
        )
        lines.append("worker groups:")
        lines.extend(_worker_lines(spec))
        lines.extend(_inferred_lines(infra))
    lines.extend(_sandbox_lines(infra))
    if launch.entrypoint:
        lines.append("entrypoint:")
        lines.extend(f"  {line}" for line in launch.entrypoint.rstrip().splitlines())
    lines.append("manifests (apply order):")
    for i, m in enumerate(manifests, 1):
        note = "  (render only, never applied by run)" if m["kind"] in RENDER_ONLY_KINDS else ""
        lines.append(f"  {i}. {m['kind']}/{m['metadata']['name']}{note}")
    if not manifests:
        lines.append("  (none)")
    return "\n".join(lines) + "\n"


def bundle(loaded: LoadedConfig, manifests: Sequence[k8s.Manifest]) -> dict[str, Any]:
    """The fully resolved bundle: sources, infra (every default filled in), recipe, manifests."""
    return {
        "sources": {
            "recipe": str(loaded.recipe_path),
            "infra": loaded.infra_source,
            "namespace": loaded.namespace_source,
        },
        "infra": k8s.plain(loaded.infra.model_dump()),
        "recipe": k8s.plain(loaded.recipe),
        "manifests": list(manifests),
    }


def bundle_text(data: Mapping[str, Any], *, json_format: bool) -> str:
    if json_format:
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    return to_yaml(dict(data))
