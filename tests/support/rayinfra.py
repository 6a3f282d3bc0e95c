"""The small Ray infra the real-node dockyard tests run: GPU-free, on one node, with a
two-replica sandbox pool serving HTTP as a non-root user (``tests/dockyard`` and the chart's
in-cluster test, which launches it through the in-cluster daemon)."""

from __future__ import annotations

from typing import Any

from nymph.localcluster.rayimage import RAY_IMAGE

MARKER = "dockyard-entrypoint-ok"
SANDBOX_UID = 1000


def infra(node: str) -> dict[str, Any]:
    """A GPU-free infra for one small node: a head with one CPU, a 100 MB object store and a 2 s
    termination grace, no workers, and a two-replica sandbox pool serving HTTP as a non-root
    user."""
    pinned = {"kubernetes.io/hostname": node}

    def group(name: str) -> dict[str, Any]:
        return {"groupName": name, "replicas": 0, "template": {"spec": {"containers": [{"name": "w"}]}}}

    return {
        "image": RAY_IMAGE,
        "placement": {"nodeSelector": pinned},
        "launch": {"mode": "rayjob", "entrypoint": f"python -c \"print('{MARKER}')\""},
        "sandbox": {
            "name": "sbx",
            "replicas": 2,
            "security": {"runAsNonRoot": True},
            "spec": {
                "template": {
                    "spec": {
                        "nodeSelector": pinned,
                        "securityContext": {"runAsUser": SANDBOX_UID, "runAsGroup": SANDBOX_UID},
                        "containers": [
                            {
                                "name": "task-executor",
                                "command": ["python3", "-m", "http.server", "9090"],
                                "resources": {
                                    "requests": {"cpu": "50m", "memory": "64Mi"},
                                    "limits": {"cpu": "200m", "memory": "128Mi"},
                                },
                            }
                        ],
                    }
                }
            },
        },
        "kuberay": {
            "name": "grpo",
            "spec": {
                "headGroupSpec": {
                    "rayStartParams": {"num-cpus": "1", "object-store-memory": "100000000"},
                    # the head's PID 1 (a shell running ``ray start``) ignores SIGTERM, so a
                    # deleted head would sit out the default 30 s grace before its SIGKILL
                    "template": {
                        "spec": {"terminationGracePeriodSeconds": 2, "containers": [{"name": "ray-head"}]}
                    },
                },
                "workerGroupSpecs": [group("trainer"), group("inference")],
            },
        },
    }


def daemon_infra(node: str, *, name: str, entrypoint: str) -> dict[str, Any]:
    """:func:`infra` for a dispatched launch: its own names, one sandbox replica."""
    spec = infra(node)
    spec["launch"]["entrypoint"] = entrypoint
    spec["kuberay"]["name"] = name
    spec["sandbox"]["name"] = f"{name}-sbx"
    spec["sandbox"]["replicas"] = 1
    return spec
