"""dockyard-k8s's two example infra files (the SWE GRPO run, vLLM and SGLang images) render
the objects dockyard-k8s renders for them: the same kinds and names in the same order, the
same entrypoint, replicas and resources, and the same fleet environment in every pod.

The infra files are written here with the settings of the examples (their comments left
out); the expectations are what dockyard-k8s's renderer makes of them: a sandbox Deployment,
Service, ``<name>-netpol`` NetworkPolicy and ``<name>-pdb`` PDB, then a RayJob named after
``kuberay.name`` carrying ``launch.entrypoint`` verbatim; requests from the ``resources``
block with each limit defaulting to its request; ``RAY_ENABLE_UV_RUN_RUNTIME_ENV=0`` and
``DOCKYARD_SANDBOX_URLS`` added to every Ray container, the authored env kept first.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from nymph.dockyard.render.k8s import Manifest
from nymph.dockyard.render.manifests import render_manifests
from nymph.dockyard.spec.load import Environment, load_config

GPU_NODES = {"nvidia.com/gpu.present": "true"}
GPU_RESOURCES = {
    "limits": {"cpu": "120", "memory": "850Gi", "nvidia.com/gpu": "8"},
    "requests": {"cpu": "96", "memory": "768Gi", "nvidia.com/gpu": "8"},
}
DSHM_MOUNTS = [{"name": "dshm", "mountPath": "/dev/shm"}]
DSHM_VOLUMES = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}}]
SANDBOX_URL = "http://dockyard-sandbox.default.svc.cluster.local:9090"


def entrypoint(config: str) -> str:
    return (
        "set -eu\n"
        "cd /opt/dockyard_rl\n"
        "python3 -u examples/run_grpo_swe.py \\\n"
        f"  --config examples/configs/{config} \\\n"
        "  env.code.sandbox_urls=null \\\n"
        "  cluster.gpus_per_node=8 \\\n"
        "  cluster.num_nodes=4 \\\n"
        "  logger.wandb_enabled=false \\\n"
        "  logger.tensorboard_enabled=true\n"
    )


def worker_group(role: str, replicas: int) -> dict[str, Any]:
    tags = f'{{"worker_units": 8, "dockyard_managed_ray_cluster": 1, "dockyard_fleet_{role}": 1}}'
    return {
        "groupName": role,
        "replicas": replicas,
        "minReplicas": replicas,
        "maxReplicas": replicas,
        "rayStartParams": {"num-gpus": "8", "object-store-memory": "200000000", "resources": tags},
        "template": {
            "spec": {
                "schedulerName": "kai-scheduler",
                "nodeSelector": dict(GPU_NODES),
                "tolerations": [{"operator": "Exists"}],
                "containers": [
                    {
                        "name": "ray-worker",
                        "env": [
                            {"name": "DOCKYARD_FLEET_ROLE", "value": role},
                            {"name": "NCCL_DEBUG", "value": "WARN"},
                            {"name": "RAY_memory_monitor_refresh_ms", "value": "0"},
                        ],
                        "resources": GPU_RESOURCES,
                        "volumeMounts": DSHM_MOUNTS,
                    }
                ],
                "volumes": DSHM_VOLUMES,
            }
        },
    }


def swe_infra(*, image: str, config: str, sandbox_resources: dict[str, str]) -> dict[str, Any]:
    """The settings of dockyard-k8s's ``grpo_swe*.infra.yaml`` examples."""
    head = {
        "rayStartParams": {
            "num-gpus": "0",
            "no-monitor": "true",
            "dashboard-host": "0.0.0.0",
            "object-store-memory": "200000000",
        },
        "template": {
            "spec": {
                "schedulerName": "kai-scheduler",
                "containers": [
                    {
                        "name": "ray-head",
                        "env": [{"name": "RAY_memory_monitor_refresh_ms", "value": "0"}],
                        "resources": {
                            "requests": {"cpu": "16", "memory": "64Gi"},
                            "limits": {"cpu": "32", "memory": "128Gi"},
                        },
                        "ports": [
                            {"containerPort": 6379, "name": "gcs-server"},
                            {"containerPort": 8265, "name": "dashboard"},
                            {"containerPort": 10001, "name": "client"},
                        ],
                        "volumeMounts": DSHM_MOUNTS,
                    }
                ],
                "volumes": DSHM_VOLUMES,
            }
        },
    }
    return {
        "image": image,
        "imagePullSecrets": ["regcred"],
        "serviceAccount": "dockyard-rl",
        "labels": {"dockyard-k8s/owner": "${user:}"},
        "scheduler": {"kind": "kai", "queue": "rl"},
        "launch": {
            "mode": "rayjob",
            "runMode": "batch",
            "codeSource": "image",
            "codePath": "/opt/dockyard_rl",
            "entrypoint": entrypoint(config),
        },
        "sandbox": {"name": "dockyard-sandbox", "replicas": 8, "port": 9090, "resources": sandbox_resources},
        "kuberay": {
            "name": "dockyard-grpo-swe",
            "labels": {"kai.scheduler/queue": "rl"},
            "spec": {
                "rayVersion": "2.52.0",
                "enableInTreeAutoscaling": False,
                "headGroupSpec": head,
                "workerGroupSpecs": [worker_group("trainer", 3), worker_group("inference", 1)],
            },
        },
    }


VLLM = swe_infra(
    image="nullvoider/ubuntu-swe:latest",
    config="grpo_swe.yaml",
    sandbox_resources={
        "cpu": "1",
        "memory": "2Gi",
        "ephemeralStorage": "10Gi",
        "cpuLimit": "4",
        "memoryLimit": "8Gi",
        "ephemeralStorageLimit": "20Gi",
    },
)
SGLANG = swe_infra(
    image="nullvoider/ubuntu-swe-sglang:latest",
    config="grpo_swe_sglang.yaml",
    sandbox_resources={"cpu": "8", "memory": "32Gi"},
)

#: what dockyard-k8s renders for each: sandbox resources block, then the shared expectations
REFERENCE: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
    "vllm": (
        VLLM,
        {
            "requests": {"cpu": "1", "memory": "2Gi", "ephemeral-storage": "10Gi"},
            "limits": {"cpu": "4", "memory": "8Gi", "ephemeral-storage": "20Gi"},
        },
        "grpo_swe.yaml",
    ),
    "sglang": (
        SGLANG,
        {"requests": {"cpu": "8", "memory": "32Gi"}, "limits": {"cpu": "8", "memory": "32Gi"}},
        "grpo_swe_sglang.yaml",
    ),
}


def rendered(name: str, tmp_path: Path, env: Environment) -> list[Manifest]:
    infra_path = tmp_path / f"{name}.infra.yaml"
    infra_path.write_text(yaml.safe_dump(REFERENCE[name][0], sort_keys=False))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("grpo: {max_num_steps: 1}\n")
    loaded = load_config(recipe_path=recipe, infra_path=infra_path, environment=env)
    return render_manifests(infra=loaded.infra)


def env_of(container: dict[str, Any]) -> list[tuple[str, str]]:
    return [(e["name"], e["value"]) for e in container.get("env") or []]


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_kinds_names_and_order(name: str, tmp_path: Path, env: Environment) -> None:
    out = rendered(name, tmp_path, env)
    assert [(m["kind"], m["metadata"]["name"]) for m in out] == [
        ("Deployment", "dockyard-sandbox"),
        ("Service", "dockyard-sandbox"),
        ("NetworkPolicy", "dockyard-sandbox-netpol"),
        ("PodDisruptionBudget", "dockyard-sandbox-pdb"),
        ("RayJob", "dockyard-grpo-swe"),
    ]
    for m in out:
        assert m["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "dockyard-k8s"
        assert m["metadata"]["labels"]["dockyard-k8s/owner"] == "tester"


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_sandbox_pool(name: str, tmp_path: Path, env: Environment) -> None:
    deployment, service = rendered(name, tmp_path, env)[:2]
    assert deployment["spec"]["replicas"] == 8
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == REFERENCE[name][0]["image"]
    assert container["resources"] == REFERENCE[name][1]
    assert env_of(container) == [("DOCKYARD_FLEET_ROLE", "sandbox"), ("API_PORT", "9090")]
    assert deployment["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "dockyard-rl"
    assert service["spec"]["ports"][0]["port"] == 9090


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_rayjob_entrypoint_replicas_resources_and_fleet_env(
    name: str, tmp_path: Path, env: Environment, validate: Callable[[Manifest], None]
) -> None:
    out = rendered(name, tmp_path, env)
    for manifest in out:
        validate(manifest)
    job = out[-1]
    assert job["spec"]["entrypoint"] == entrypoint(REFERENCE[name][2])
    assert job["spec"]["submissionMode"] == "HTTPMode"
    assert job["spec"]["shutdownAfterJobFinishes"] is True
    assert job["metadata"]["labels"]["kai.scheduler/queue"] == "rl"
    cluster = job["spec"]["rayClusterSpec"]
    head = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert head["resources"] == {
        "requests": {"cpu": "16", "memory": "64Gi"},
        "limits": {"cpu": "32", "memory": "128Gi"},
    }
    cross = [("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0"), ("DOCKYARD_SANDBOX_URLS", SANDBOX_URL)]
    assert sorted(env_of(head)) == sorted([("RAY_memory_monitor_refresh_ms", "0"), *cross])
    groups = cluster["workerGroupSpecs"]
    assert [(g["groupName"], g["replicas"], g["minReplicas"], g["maxReplicas"]) for g in groups] == [
        ("trainer", 3, 3, 3),
        ("inference", 1, 1, 1),
    ]
    for group in groups:
        pod = group["template"]["spec"]
        (container,) = pod["containers"]
        assert container["image"] == REFERENCE[name][0]["image"]
        assert container["resources"] == GPU_RESOURCES
        authored = [
            ("DOCKYARD_FLEET_ROLE", group["groupName"]),
            ("NCCL_DEBUG", "WARN"),
            ("RAY_memory_monitor_refresh_ms", "0"),
        ]
        assert env_of(container)[:3] == authored
        assert sorted(env_of(container)) == sorted([*authored, *cross])
        assert pod["nodeSelector"] == GPU_NODES
        assert pod["serviceAccountName"] == "dockyard-rl"
