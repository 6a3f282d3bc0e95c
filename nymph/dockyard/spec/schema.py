"""The infra schema: dockyard-k8s's ``InfraConfig`` as strict pydantic models.

Field names are the YAML keys, so infra files written for dockyard-k8s load unchanged. Every
block forbids unknown keys (``extra="forbid"``) and validates strictly: the few conversions
YAML needs are explicit (:mod:`nymph.dockyard.spec.fieldtypes`). Errors are turned into
nymph's own messages, with the key path and the file, by :mod:`nymph.dockyard.spec.parse`.

A block given partially keeps the *field's* defaults for the keys it leaves out
(``sandbox: {security: {runAsNonRoot: true}}`` keeps the sandbox hardening on), except that
setting one of a PDB's ``minAvailable`` / ``maxUnavailable`` drops the default of the other,
and that a ``resources`` block replaces the default as a whole (as dockyard-k8s does).

Cross-field rules live in ``problems()`` (relative key, message) and are reported with the
full key path by the parser.

Hardening defaults: ON for the sandbox pool (``sandbox.security``, ``sandbox.networkPolicy``,
``sandbox.pdb``, small requests with an ephemeral-storage request), OFF for the GPU fleets
(top-level ``security``, ``kuberay.pdb``) until enabled.

This module imports pydantic: import it only where the infra is loaded or rendered (the
daemon imports the dockyard render path lazily, on its first dockyard task).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator, Field

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
from nymph.dockyard.spec.fieldtypes import (
    Block,
    Problems,
    Qty,
    QtyMap,
    Quantity,
    Str,
    StrMap,
    StrTuple,
    as_enum,
    as_tuple,
)
from nymph.dockyard.spec.podblocks import NetworkPolicySpec, PDBSpec, PodResources, SecuritySpec

__all__ = ["NetworkPolicySpec", "PDBSpec", "PodResources", "Quantity", "SecuritySpec"]

_Scheduler = Annotated[SchedulerKind, BeforeValidator(as_enum(SchedulerKind))]
_Workspace = Annotated[WorkspaceKind, BeforeValidator(as_enum(WorkspaceKind))]
_HFCache = Annotated[HFCacheKind, BeforeValidator(as_enum(HFCacheKind))]
_Checkpoints = Annotated[CheckpointsKind, BeforeValidator(as_enum(CheckpointsKind))]
_Submit = Annotated[SubmitKind, BeforeValidator(as_enum(SubmitKind))]
_PortForward = Annotated[PortForwardMode, BeforeValidator(as_enum(PortForwardMode))]
_Submitter = Annotated[SubmitterMode, BeforeValidator(as_enum(SubmitterMode))]
_Launch = Annotated[LaunchMode, BeforeValidator(as_enum(LaunchMode))]
_RunMode = Annotated[RunMode, BeforeValidator(as_enum(RunMode))]
_CodeSource = Annotated[CodeSource, BeforeValidator(as_enum(CodeSource))]
_FreeForm = dict[str, Any]


def _pvc_problems(kind: StrEnum, pvc_name: str | None, needs: tuple[StrEnum, ...]) -> Problems:
    if kind in needs and not pvc_name:
        return [("pvcName", f"required when kind is {kind.value}")]
    return []


class SchedulerSpec(Block):
    kind: _Scheduler = SchedulerKind.DEFAULT
    queue: Str | None = None

    def problems(self) -> Problems:
        if self.kind in (SchedulerKind.KAI, SchedulerKind.KUEUE) and not self.queue:
            return [("queue", f"required when kind is {self.kind.value}")]
        return []


class Toleration(Block):
    key: Str | None = None
    operator: Literal["Equal", "Exists"] = "Equal"
    value: Str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = "NoSchedule"
    tolerationSeconds: int | None = None

    def problems(self) -> Problems:
        if self.operator == "Equal" and not self.key:
            return [("key", "required when operator is Equal")]
        if self.operator == "Exists" and self.value is not None:
            return [("value", "must be unset when operator is Exists")]
        return []


class PlacementSpec(Block):
    """Where the GPU cluster's pods go (the sandbox pool is not pinned by it)."""

    nodeSelector: StrMap = Field(default_factory=dict)
    tolerations: Annotated[tuple[Toleration, ...], BeforeValidator(as_tuple)] = ()
    affinity: _FreeForm | None = None

    def problems(self) -> Problems:
        return names.label_map(self.nodeSelector, key="nodeSelector")


class NetworkingSpec(Block):
    """Host networking and NCCL / gloo settings for the GPU pods."""

    hostNetwork: bool = False
    gloo_socket_ifname: Str | None = None
    nccl_socket_ifname: Str | None = None
    nccl_ib_disable: bool = False
    nccl_net: Literal["Socket", "IB", "OFI"] | None = None
    extra_env: StrMap = Field(default_factory=dict)


class WorkspaceSpec(Block):
    kind: _Workspace = WorkspaceKind.RAY_UPLOAD
    pvcName: Str | None = None
    mountPath: Str = "/mnt/dockyard"
    repoSubdir: Str = "workdirs"
    size: Qty | None = None
    hostPath: Str | None = None

    def problems(self) -> Problems:
        out = _pvc_problems(self.kind, self.pvcName, (WorkspaceKind.LUSTRE, WorkspaceKind.PVC))
        if self.kind is WorkspaceKind.HOST_PATH and not self.hostPath:
            out.append(("hostPath", "required when kind is hostPath"))
        return out


class HFCacheSpec(Block):
    kind: _HFCache = HFCacheKind.NONE
    pvcName: Str | None = None
    mountPath: Str = "/root/.cache/huggingface"

    def problems(self) -> Problems:
        return _pvc_problems(self.kind, self.pvcName, (HFCacheKind.LUSTRE, HFCacheKind.PVC))


class CheckpointsSpec(Block):
    kind: _Checkpoints = CheckpointsKind.NONE
    pvcName: Str | None = None
    mountPath: Str = "/mnt/dockyard/checkpoints"

    def problems(self) -> Problems:
        return _pvc_problems(self.kind, self.pvcName, (CheckpointsKind.LUSTRE, CheckpointsKind.PVC))


class SubmitSpec(Block):
    """How the live layer delivers a job (not consulted by render)."""

    kind: _Submit = SubmitKind.SDK
    portForward: _PortForward = PortForwardMode.AUTO
    localDashboardPort: int = 18265
    submitter: _Submitter = SubmitterMode.PORT_FORWARD
    execTmpDir: Str = "/tmp"

    def problems(self) -> Problems:
        if not 1 <= self.localDashboardPort <= 65535:
            return [("localDashboardPort", "must be a port number 1-65535")]
        return []


class LaunchSpec(Block):
    mode: _Launch = LaunchMode.RAYJOB
    runMode: _RunMode = RunMode.INTERACTIVE
    attach: Str | None = None
    entrypoint: Str | None = None
    env: StrMap = Field(default_factory=dict)
    rayUploadPaths: StrTuple | None = None
    codeSource: _CodeSource = CodeSource.UPLOAD
    codePath: Str | None = None

    def problems(self) -> Problems:
        out: Problems = []
        if self.mode is LaunchMode.ATTACH and not self.attach:
            out.append(("attach", "required when mode is attach (the RayCluster to submit to)"))
        if self.codeSource in (CodeSource.IMAGE, CodeSource.LUSTRE) and not self.codePath:
            out.append(("codePath", f"required when codeSource is {self.codeSource.value}"))
        return out


class ClusterSpec(Block):
    """The one GPU RayCluster (trainer + inference worker groups, or one plain Ray worker
    group). ``spec`` is a free-form RayCluster ``.spec``; cross-cutting fields are patched into
    it at render time."""

    name: Str
    spec: _FreeForm
    labels: StrMap = Field(default_factory=dict)
    annotations: StrMap = Field(default_factory=dict)
    segmentSize: int | None = None
    pdb: PDBSpec = Field(default_factory=PDBSpec)

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


class SandboxSpec(Block):
    """The GPU-free executor pool: a Deployment behind a ClusterIP Service. A ``resources``
    block replaces the default (with its ephemeral-storage request) as a whole."""

    replace_whole: ClassVar[tuple[str, ...]] = ("resources",)

    name: Str = "dockyard-sandbox"
    replicas: int = 2
    port: int = 9090
    spec: _FreeForm | None = None
    resources: PodResources = Field(default_factory=_sandbox_resources)
    env: StrMap = Field(default_factory=dict)
    labels: StrMap = Field(default_factory=dict)
    annotations: StrMap = Field(default_factory=dict)
    security: SecuritySpec = Field(default_factory=SecuritySpec)
    networkPolicy: NetworkPolicySpec = Field(default_factory=NetworkPolicySpec)
    pdb: PDBSpec = Field(default_factory=_sandbox_pdb)
    topologySpreadConstraints: Annotated[tuple[_FreeForm, ...], BeforeValidator(as_tuple)] = ()
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


class ResourceQuotaSpec(Block):
    """Namespace quota: rendered, never applied by the live path."""

    enabled: bool = False
    name: Str = "dockyard-quota"
    hard: QtyMap = Field(default_factory=dict)

    def problems(self) -> Problems:
        if self.enabled and not self.hard:
            return [("hard", "required when enabled (e.g. requests.nvidia.com/gpu: '32')")]
        return []


class LimitRangeSpec(Block):
    """Per-container namespace limits: rendered, never applied by the live path."""

    enabled: bool = False
    name: Str = "dockyard-limits"
    default: QtyMap = Field(default_factory=dict)
    defaultRequest: QtyMap = Field(default_factory=dict)
    max: QtyMap = Field(default_factory=dict)
    min: QtyMap = Field(default_factory=dict)

    def problems(self) -> Problems:
        if self.enabled and not (self.default or self.defaultRequest or self.max or self.min):
            return [("", "needs one of default / defaultRequest / max / min when enabled")]
        return []


class DRASpec(Block):
    """The DRA objects rendered for the GPU workers' well-known resource claims
    (:mod:`nymph.dockyard.render.dra`): ``autoCreate`` off leaves the claims as authored."""

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


class InfraConfig(Block):
    namespace: Str
    image: Str
    imagePullSecrets: StrTuple = ()
    rayVersion: Str | None = None
    serviceAccount: Str | None = None
    priorityClassName: Str | None = None
    scheduler: SchedulerSpec = Field(default_factory=SchedulerSpec)
    placement: PlacementSpec = Field(default_factory=PlacementSpec)
    networking: NetworkingSpec = Field(default_factory=NetworkingSpec)
    security: SecuritySpec = Field(default_factory=_gpu_security)
    workspace: WorkspaceSpec = Field(default_factory=WorkspaceSpec)
    hf_cache: HFCacheSpec = Field(default_factory=HFCacheSpec)
    checkpoints: CheckpointsSpec = Field(default_factory=CheckpointsSpec)
    submit: SubmitSpec = Field(default_factory=SubmitSpec)
    launch: LaunchSpec = Field(default_factory=LaunchSpec)
    kuberay: ClusterSpec | None = None
    sandbox: SandboxSpec | None = None
    dra: DRASpec = Field(default_factory=DRASpec)
    resourceQuota: ResourceQuotaSpec = Field(default_factory=ResourceQuotaSpec)
    limitRange: LimitRangeSpec = Field(default_factory=LimitRangeSpec)
    labels: StrMap = Field(default_factory=dict)
    annotations: StrMap = Field(default_factory=dict)

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
