"""The closed vocabularies of the infra schema (YAML values are the enum values)."""

from __future__ import annotations

from enum import StrEnum


class SchedulerKind(StrEnum):
    DEFAULT = "default"
    KAI = "kai"
    KUEUE = "kueue"


class WorkspaceKind(StrEnum):
    LUSTRE = "lustre"
    PVC = "pvc"
    HOST_PATH = "hostPath"
    RAY_UPLOAD = "rayUpload"
    AUTO = "auto"


class HFCacheKind(StrEnum):
    LUSTRE = "lustre"
    PVC = "pvc"
    EMPTY_DIR = "emptyDir"
    NONE = "none"


class CheckpointsKind(StrEnum):
    LUSTRE = "lustre"
    PVC = "pvc"
    NONE = "none"


class SubmitKind(StrEnum):
    SDK = "sdk"
    RAYJOB = "rayjob"


class PortForwardMode(StrEnum):
    KUBECTL_RAY_PLUGIN = "kubectl-ray-plugin"
    KUBECTL_PORT_FORWARD = "kubectl-port-forward"
    AUTO = "auto"


class SubmitterMode(StrEnum):
    PORT_FORWARD = "portForward"
    EXEC = "exec"


class LaunchMode(StrEnum):
    RAYJOB = "rayjob"  # one RayJob: KubeRay creates the cluster, runs the entrypoint, tears down
    BRINGUP = "bringup"  # a long-lived RayCluster; jobs are submitted to it
    ATTACH = "attach"  # submit to an existing RayCluster (launch.attach); nothing rendered


class RunMode(StrEnum):
    INTERACTIVE = "interactive"
    BATCH = "batch"


class CodeSource(StrEnum):
    UPLOAD = "upload"
    IMAGE = "image"
    LUSTRE = "lustre"
