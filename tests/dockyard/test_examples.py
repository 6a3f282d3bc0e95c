"""The example recipe + infra pairs under manifests/examples render and validate."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from nymph.dockyard.render.k8s import Manifest
from nymph.dockyard.render.manifests import render_manifests, to_yaml
from nymph.dockyard.spec.load import Environment, load_config

EXAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "examples"
PAIRS = ["vllm", "sglang"]


def _load(name: str, env: Environment) -> list[Manifest]:
    loaded = load_config(
        recipe_path=EXAMPLES / f"dockyard-grpo-{name}.yaml",
        infra_path=EXAMPLES / f"dockyard-grpo-{name}.infra.yaml",
        environment=env,
    )
    return render_manifests(infra=loaded.infra)


@pytest.mark.parametrize("name", PAIRS)
def test_example_validates(name: str, env: Environment, validate: Callable[[Manifest], None]) -> None:
    manifests = _load(name, env)
    for manifest in manifests:
        validate(manifest)
    assert to_yaml(manifests) == to_yaml(_load(name, env))


def test_vllm_example(env: Environment) -> None:
    out = _load("vllm", env)
    assert [m["kind"] for m in out] == [
        "Deployment",
        "Service",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "RayJob",
    ]
    job = out[-1]
    assert job["metadata"]["namespace"] == "default"  # inferred: no context in the test env
    assert job["metadata"]["labels"]["dockyard/owner"] == "tester"
    assert job["metadata"]["labels"]["kai.scheduler/queue"] == "rl"
    groups = job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert [g["rayStartParams"]["resources"] for g in groups] == [
        '\'{"dockyard_managed_ray_cluster": 1, "dockyard_fleet_trainer": 1}\'',
        "'{\"dockyard_fleet_inference\": 1}'",
    ]
    for g in groups:
        env_names = {e["name"]: e["value"] for e in g["template"]["spec"]["containers"][0]["env"]}
        assert env_names["DOCKYARD_SANDBOX_URLS"] == (
            "http://dockyard-sandbox.default.svc.cluster.local:9090"
        )
        assert env_names["HF_HOME"] == "/root/.cache/huggingface"


def test_sglang_example(env: Environment) -> None:
    out = _load("sglang", dataclasses.replace(env, env={"DOCKYARD_TEAM": "vision"}))
    assert [m["kind"] for m in out] == [
        "ResourceQuota",
        "LimitRange",
        "Deployment",
        "Service",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "PodDisruptionBudget",
        "RayCluster",
    ]
    assert {m["metadata"]["namespace"] for m in out} == {"rl-vision"}
    netpol = out[4]["spec"]
    assert {} not in netpol["egress"]
    cluster = out[-1]
    assert cluster["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "rl-gpu"
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]
    assert head["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}


def test_example_files_exist() -> None:
    for name in PAIRS:
        for suffix in (".yaml", ".infra.yaml"):
            assert (EXAMPLES / f"dockyard-grpo-{name}{suffix}").is_file()
