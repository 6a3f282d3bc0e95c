"""The infra schema: dockyard-k8s's ``InfraConfig`` as frozen dataclasses.

Field names are the YAML keys, so infra files written for dockyard-k8s load unchanged.
Parsing (:mod:`nymph.dockyard.spec.parse`) is strict: an unknown key is an error that names the
key path and the allowed keys. A block given partially keeps the *field's* defaults for the
keys it leaves out (``sandbox: {security: {runAsNonRoot: true}}`` keeps the sandbox
hardening on), except that setting one of a PDB's ``minAvailable`` / ``maxUnavailable``
drops the default of the other.

Cross-field rules live in ``problems()`` (relative key, message) and are reported with the
full key path by the parser.

Hardening defaults: ON for the sandbox pool (``sandbox.security``, ``sandbox.networkPolicy``,
``sandbox.pdb``, small requests with an ephemeral-storage request), OFF for the GPU fleets
(top-level ``security``, ``kuberay.pdb``) until enabled.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, Literal, NewType

from nymph.dockyard.spec import names
from nymph.dockyard.spec.enums import (
    CheckpointsKind,
    CodeSource,
    HFCacheKind,
    LaunchMode,
    PortForwardMode,
    RunMode,
    SchedulerKind,
    SubmitKind,
    SubmitterMode,
    WorkspaceKind,
)

#: A Kubernetes resource quantity (``"500m"``, ``"2Gi"``); YAML numbers are accepted.
Quantity = NewType("Quantity", str)

Problems = list[tuple[str, str]]


def _pvc_problems(kind: StrEnum, pvc_name: str | None, needs: tuple[StrEnum, ...]) -> Problems:
    if kind in needs and not pvc_name:
        return [("pvcName", f"required when kind is {kind.value}")]
    return []


@dataclass(frozen=True, kw_only=True)
class SchedulerSpec:
    kind: SchedulerKind = SchedulerKind.DEFAULT
    queue: str | None = None

    def problems(self) -> Problems:
        if self.kind in (SchedulerKind.KAI, SchedulerKind.KUEUE) and not self.queue:
            return [("queue", f"required when kind is {self.kind.value}")]
        return []


@dataclass(frozen=True, kw_only=True)
class Toleration:
    key: str | None = None
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = "NoSchedule"
    tolerationSeconds: int | None = None

    def problems(self) -> Problems:
        if self.operator == "Equal" and not self.key:
            return [("key", "required when operator is Equal")]
        if self.operator == "Exists" and self.value is not None:
            return [("value", "must be unset when operator is Exists")]
        return []


@dataclass(frozen=True, kw_only=True)
class PlacementSpec:
    """Where the GPU cluster's pods go (the sandbox pool is not pinned by it)."""

    nodeSelector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    affinity: Mapping[str, Any] | None = None

    def problems(self) -> Problems:
        return names.label_map(self.nodeSelector, key="nodeSelector")


@dataclass(frozen=True, kw_only=True)
class NetworkingSpec:
    """Host networking and NCCL / gloo settings for the GPU pods."""

    hostNetwork: bool = False
    gloo_socket_ifname: str | None = None
    nccl_socket_ifname: str | None = None
    nccl_ib_disable: bool = False
    nccl_net: Literal["Socket", "IB", "OFI"] | None = None
    extra_env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class WorkspaceSpec:
    kind: WorkspaceKind = WorkspaceKind.RAY_UPLOAD
    pvcName: str | None = None
    mountPath: str = "/mnt/dockyard"
    repoSubdir: str = "workdirs"
    size: Quantity | None = None
    hostPath: str | None = None

    def problems(self) -> Problems:
        out = _pvc_problems(self.kind, self.pvcName, (WorkspaceKind.LUSTRE, WorkspaceKind.PVC))
        if self.kind is WorkspaceKind.HOST_PATH and not self.hostPath:
            out.append(("hostPath", "required when kind is hostPath"))
        return out


@dataclass(frozen=True, kw_only=True)
class HFCacheSpec:
    kind: HFCacheKind = HFCacheKind.NONE
    pvcName: str | None = None
    mountPath: str = "/root/.cache/huggingface"

    def problems(self) -> Problems:
        return _pvc_problems(self.kind, self.pvcName, (HFCacheKind.LUSTRE, HFCacheKind.PVC))


@dataclass(frozen=True, kw_only=True)
class CheckpointsSpec:
    kind: CheckpointsKind = CheckpointsKind.NONE
    pvcName: str | None = None
    mountPath: str = "/mnt/dockyard/checkpoints"

    def problems(self) -> Problems:
        return _pvc_problems(self.kind, self.pvcName, (CheckpointsKind.LUSTRE, CheckpointsKind.PVC))


@dataclass(frozen=True, kw_only=True)
class SubmitSpec:
    """How the live layer delivers a job (not consulted by render)."""

    kind: SubmitKind = SubmitKind.SDK
    portForward: PortForwardMode = PortForwardMode.AUTO
    localDashboardPort: int = 18265
    submitter: SubmitterMode = SubmitterMode.PORT_FORWARD
    execTmpDir: str = "/tmp"

    def problems(self) -> Problems:
        if not 1 <= self.localDashboardPort <= 65535:
            return [("localDashboardPort", "must be a port number 1-65535")]
        return []


@dataclass(frozen=True, kw_only=True)
class LaunchSpec:
    mode: LaunchMode = LaunchMode.RAYJOB
    runMode: RunMode = RunMode.INTERACTIVE
    attach: str | None = None
    entrypoint: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    rayUploadPaths: tuple[str, ...] | None = None
    codeSource: CodeSource = CodeSource.UPLOAD
    codePath: str | None = None

    def problems(self) -> Problems:
        out: Problems = []
        if self.mode is LaunchMode.ATTACH and not self.attach:
            out.append(("attach", "required when mode is attach (the RayCluster to submit to)"))
        if self.codeSource in (CodeSource.IMAGE, CodeSource.LUSTRE) and not self.codePath:
            out.append(("codePath", f"required when codeSource is {self.codeSource.value}"))
        return out


@dataclass(frozen=True, kw_only=True)
class SecuritySpec:
    """Pod / container hardening. ``runAsNonRoot`` and ``readOnlyRootFilesystem`` are
    opt-in (``null`` leaves them unset): they break many images."""

    enabled: bool = True
    runAsNonRoot: bool | None = None
    runAsUser: int | None = None
    runAsGroup: int | None = None
    fsGroup: int | None = None
    readOnlyRootFilesystem: bool | None = None
    allowPrivilegeEscalation: bool = False
    dropCapabilities: tuple[str, ...] = ("ALL",)
    addCapabilities: tuple[str, ...] = ()
    seccompProfile: Literal["RuntimeDefault", "Unconfined"] | None = "RuntimeDefault"


@dataclass(frozen=True, kw_only=True)
class NetworkPolicySpec:
    """Sandbox isolation: ingress only on the executor port from this namespace (or from
    pods with ``fromLabels``); egress open unless ``allowEgress: false``, then only to
    ``allowedEgressCidrs``; DNS is always allowed."""

    enabled: bool = True
    allowEgress: bool = True
    allowedEgressCidrs: tuple[str, ...] = ()
    fromLabels: Mapping[str, str] = field(default_factory=dict)

    def problems(self) -> Problems:
        out: Problems = []
        for i, cidr in enumerate(self.allowedEgressCidrs):
            try:
                if "/" not in cidr:
                    raise ValueError(cidr)
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                out.append((f"allowedEgressCidrs[{i}]", f"{cidr!r} is not a CIDR (10.0.0.0/8)"))
        return out + names.label_map(self.fromLabels, key="fromLabels")


@dataclass(frozen=True, kw_only=True)
class PDBSpec:
    enabled: bool = False
    minAvailable: int | str | None = None
    maxUnavailable: int | str | None = None

    #: Setting one of these in a partial block drops the default of the other.
    exclusive: ClassVar[tuple[str, ...]] = ("minAvailable", "maxUnavailable")

    def problems(self) -> Problems:
        if self.enabled and (self.minAvailable is None) == (self.maxUnavailable is None):
            return [("", "exactly one of minAvailable / maxUnavailable must be set when enabled")]
        return []


@dataclass(frozen=True, kw_only=True)
class PodResources:
    """Requests (``cpu``, ``memory``, ``ephemeralStorage``) and limits (``*Limit``), each
    limit defaulting to its request."""

    cpu: Quantity | None = None
    memory: Quantity | None = None
    gpu: int | None = None
    ephemeralStorage: Quantity | None = None
    cpuLimit: Quantity | None = None
    memoryLimit: Quantity | None = None
    ephemeralStorageLimit: Quantity | None = None


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """The one GPU RayCluster (trainer + inference worker groups). ``spec`` is a free-form
    RayCluster ``.spec``; cross-cutting fields are patched into it at render time."""

    name: str
    spec: Mapping[str, Any]
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    segmentSize: int | None = None
    pdb: PDBSpec = field(default_factory=PDBSpec)

    def problems(self) -> Problems:
        out = names.dns1035_label(self.name, key="name")
        out += names.label_map(self.labels, key="labels")
        if self.segmentSize is not None and self.segmentSize < 1:
            out.append(("segmentSize", "must be a positive integer"))
        return out


def _sandbox_resources() -> PodResources:
    return PodResources(cpu=Quantity("1"), memory=Quantity("2Gi"), ephemeralStorage=Quantity("10Gi"))


def _sandbox_pdb() -> PDBSpec:
    return PDBSpec(enabled=True, maxUnavailable=1)


@dataclass(frozen=True, kw_only=True)
class SandboxSpec:
    """The GPU-free executor pool: a Deployment behind a ClusterIP Service."""

    name: str = "dockyard-sandbox"
    replicas: int = 2
    port: int = 9090
    spec: Mapping[str, Any] | None = None
    resources: PodResources = field(default_factory=_sandbox_resources)
    env: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    security: SecuritySpec = field(default_factory=SecuritySpec)
    networkPolicy: NetworkPolicySpec = field(default_factory=NetworkPolicySpec)
    pdb: PDBSpec = field(default_factory=_sandbox_pdb)
    topologySpreadConstraints: tuple[Mapping[str, Any], ...] = ()
    healthCheckTimeoutS: int = 300
    injectUrls: bool = True

    def problems(self) -> Problems:
        out = names.dns1035_label(self.name, key="name")
        out += names.label_map(self.labels, key="labels")
        if self.replicas < 1:
            out.append(("replicas", "must be at least 1"))
        if not 1 <= self.port <= 65535:
            out.append(("port", "must be a port number 1-65535"))
        if self.healthCheckTimeoutS < 1:
            out.append(("healthCheckTimeoutS", "must be a positive number of seconds"))
        if self.resources.gpu:
            out.append(("resources.gpu", "must be unset: the sandbox pool is GPU-free"))
        return out


@dataclass(frozen=True, kw_only=True)
class ResourceQuotaSpec:
    """Namespace quota: rendered, never applied by the live path."""

    enabled: bool = False
    name: str = "dockyard-quota"
    hard: Mapping[str, Quantity] = field(default_factory=dict)

    def problems(self) -> Problems:
        if self.enabled and not self.hard:
            return [("hard", "required when enabled (e.g. requests.nvidia.com/gpu: '32')")]
        return []


@dataclass(frozen=True, kw_only=True)
class LimitRangeSpec:
    """Per-container namespace limits: rendered, never applied by the live path."""

    enabled: bool = False
    name: str = "dockyard-limits"
    default: Mapping[str, Quantity] = field(default_factory=dict)
    defaultRequest: Mapping[str, Quantity] = field(default_factory=dict)
    max: Mapping[str, Quantity] = field(default_factory=dict)
    min: Mapping[str, Quantity] = field(default_factory=dict)

    def problems(self) -> Problems:
        if self.enabled and not (self.default or self.defaultRequest or self.max or self.min):
            return [("", "needs one of default / defaultRequest / max / min when enabled")]
        return []


@dataclass(frozen=True, kw_only=True)
class DRASpec:
    """Accepted for compatibility; nymph does not render DRA objects."""

    autoCreate: bool = True
    roceCount: int = 8
    computeDomainNumNodes: int = 0

    def problems(self) -> Problems:
        out: Problems = []
        if self.roceCount < 1:
            out.append(("roceCount", "must be at least 1"))
        if self.computeDomainNumNodes < 0:
            out.append(("computeDomainNumNodes", "must be 0 (elastic) or more"))
        return out


def _gpu_security() -> SecuritySpec:
    return SecuritySpec(enabled=False)


@dataclass(frozen=True, kw_only=True)
class InfraConfig:
    namespace: str
    image: str
    imagePullSecrets: tuple[str, ...] = ()
    rayVersion: str | None = None
    serviceAccount: str | None = None
    priorityClassName: str | None = None
    scheduler: SchedulerSpec = field(default_factory=SchedulerSpec)
    placement: PlacementSpec = field(default_factory=PlacementSpec)
    networking: NetworkingSpec = field(default_factory=NetworkingSpec)
    security: SecuritySpec = field(default_factory=_gpu_security)
    workspace: WorkspaceSpec = field(default_factory=WorkspaceSpec)
    hf_cache: HFCacheSpec = field(default_factory=HFCacheSpec)
    checkpoints: CheckpointsSpec = field(default_factory=CheckpointsSpec)
    submit: SubmitSpec = field(default_factory=SubmitSpec)
    launch: LaunchSpec = field(default_factory=LaunchSpec)
    kuberay: ClusterSpec | None = None
    sandbox: SandboxSpec | None = None
    dra: DRASpec = field(default_factory=DRASpec)
    resourceQuota: ResourceQuotaSpec = field(default_factory=ResourceQuotaSpec)
    limitRange: LimitRangeSpec = field(default_factory=LimitRangeSpec)
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)

    def problems(self) -> Problems:
        out: Problems = []
        if not self.image.strip():
            out.append(("image", "must not be empty"))
        out += names.dns1123_label(self.namespace, key="namespace")
        out += names.label_map(self.labels, key="labels")
        if self.launch.mode is not LaunchMode.ATTACH and self.kuberay is None:
            out.append(
                (
                    "kuberay",
                    f"required when launch.mode is {self.launch.mode.value} "
                    "(the GPU RayCluster: name + spec)",
                )
            )
        if self.launch.mode is LaunchMode.RAYJOB and not self.launch.entrypoint:
            out.append(("launch.entrypoint", "required when launch.mode is rayjob"))
        return out
