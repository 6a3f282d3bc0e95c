"""The user's CPU dev Pod and secrets Secret, as dockyard-k8s names them (pure).

``<user>-dev-pod`` mounts the workspace PVC (``dockyard-workspace``) at ``/mnt/dockyard``,
starts in ``/mnt/dockyard/<user>``, lands on a node without a GPU, takes every key of the
user's ``<user>-secrets`` Secret as environment (optional: the Pod starts without it), writes
the SSH key and rclone config found there into place, then sleeps until deleted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nymph.dockyard.render import k8s

DEFAULT_IMAGE = "nullvoider/ubuntu-swe:latest"
DEFAULT_PULL_SECRET = "regcred"  # noqa: S105 - the name of an image pull Secret
WORKSPACE_PVC = "dockyard-workspace"
MOUNT_PATH = "/mnt/dockyard"
COMPONENT_KEY = "dockyard-k8s/component"
OWNER_KEY = "dockyard-k8s/owner"
#: the keys a first ``dev setup-secrets`` must set (with ``--ssh-key``)
FIRST_TIME_KEYS = ("HF_TOKEN", "WANDB_API_KEY")

_START = (
    'mkdir -p "$DOCKYARD_HOME" /root/.ssh && '
    'if [ -n "$SSH_KEY_CONTENT" ]; then printf "%s\\n" "$SSH_KEY_CONTENT" > "/root/.ssh/$SSH_KEY_NAME" '
    '&& chmod 600 "/root/.ssh/$SSH_KEY_NAME"; fi && '
    'if [ -n "$RCLONE_CONF" ]; then mkdir -p /root/.config/rclone && '
    'printf "%s\\n" "$RCLONE_CONF" > /root/.config/rclone/rclone.conf; fi && '
    "exec sleep infinity"
)


def pod_name(user: str) -> str:
    return f"{user}-dev-pod"


def secret_name(user: str) -> str:
    return f"{user}-secrets"


def dev_pod(
    *,
    user: str,
    namespace: str,
    image: str = DEFAULT_IMAGE,
    pvc: str = WORKSPACE_PVC,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    home = f"{MOUNT_PATH}/{user}"
    pod_labels = k8s.labels(dict(labels or {}), {OWNER_KEY: user, COMPONENT_KEY: "dev-pod"})
    no_gpu = {"key": "nvidia.com/gpu.product", "operator": "DoesNotExist"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod_name(user), "namespace": namespace, "labels": pod_labels},
        "spec": {
            "restartPolicy": "Never",
            "imagePullSecrets": [{"name": DEFAULT_PULL_SECRET}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [no_gpu]}]
                    }
                }
            },
            "containers": [
                {
                    "name": "dev",
                    "image": image,
                    "command": ["sh", "-c", _START],
                    "workingDir": home,
                    "env": [{"name": "USER", "value": user}, {"name": "DOCKYARD_HOME", "value": home}],
                    "envFrom": [{"secretRef": {"name": secret_name(user), "optional": True}}],
                    "resources": {
                        "requests": {"cpu": "100m", "memory": "256Mi"},
                        "limits": {"cpu": "5", "memory": "10Gi"},
                    },
                    "volumeMounts": [{"name": "workspace", "mountPath": MOUNT_PATH}],
                }
            ],
            "volumes": [{"name": "workspace", "persistentVolumeClaim": {"claimName": pvc}}],
        },
    }


def secret(*, user: str, namespace: str, data: Mapping[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": secret_name(user),
            "namespace": namespace,
            "labels": k8s.labels({OWNER_KEY: user, COMPONENT_KEY: "secrets"}),
        },
        "type": "Opaque",
        "stringData": dict(data),
    }
