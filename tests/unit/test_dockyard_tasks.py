"""The pure parts of the daemon's dockyard task handling: spec checks, object naming."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from nymph.daemon.runner import HandlerKey
from nymph.daemon.tasks.dockyard import DockyardObject, render
from nymph.dockyard.errors import DockyardConfigError
from nymph.launch.render import manifest_sha256
from nymph.protocol import TaskJSON, TaskKind

EXAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "examples"
SPEC: dict[str, Any] = {
    "recipe": yaml.safe_load((EXAMPLES / "dockyard-grpo-vllm.yaml").read_text()),
    "infra": yaml.safe_load((EXAMPLES / "dockyard-grpo-vllm.infra.yaml").read_text()),
    "overrides": [],
    "namespace": "jobs",
}


def test_render_gives_the_objects_in_apply_order_in_the_task_namespace() -> None:
    manifests = render(SPEC, namespace="jobs")
    assert [m["kind"] for m in manifests] == [
        "Deployment",
        "Service",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "RayJob",
    ]
    assert {m["metadata"]["namespace"] for m in manifests} == {"jobs"}
    assert render(SPEC, namespace="jobs") == manifests  # deterministic: a redelivery re-applies the same


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        (None, "no dockyard spec"),
        ({**SPEC, "recipe": None}, "recipe"),
        ({**SPEC, "infra": ["x"]}, "infra"),
        ({**SPEC, "overrides": "a=b"}, "overrides"),
        ({**SPEC, "overrides": [1]}, "overrides"),
        ({**SPEC, "namespace": "other"}, "namespace"),
        ({**SPEC, "infra": {**SPEC["infra"], "colour": 1}}, "infra.colour"),
    ],
)
def test_render_refuses_a_bad_spec(spec: object, needle: str) -> None:
    with pytest.raises(DockyardConfigError, match=needle):
        render(spec, namespace="jobs")


def test_objects_are_named_as_kubectl_prints_them() -> None:
    by_kind = {m["kind"]: DockyardObject.of(m) for m in render(SPEC, namespace="jobs")}
    assert by_kind["Deployment"].printed_name == "deployment.apps/dockyard-sandbox"
    assert by_kind["Service"].printed_name == "service/dockyard-sandbox"
    assert by_kind["NetworkPolicy"].printed_name == "networkpolicy.networking.k8s.io/dockyard-sandbox-netpol"
    assert by_kind["PodDisruptionBudget"].printed_name == "poddisruptionbudget.policy/dockyard-sandbox-pdb"
    assert by_kind["RayJob"].printed_name == "rayjob.ray.io/dockyard-grpo-vllm"
    assert by_kind["RayJob"].ref == "RayJob/dockyard-grpo-vllm"
    deployment = render(SPEC, namespace="jobs")[0]
    assert by_kind["Deployment"].to_json() == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "namespace": "jobs",
        "name": "dockyard-sandbox",
        "manifestSha256": manifest_sha256(deployment),
    }


def is_dockyard_stop(task: dict[str, Any]) -> bool:
    return HandlerKey.of(cast(TaskJSON, task)) == HandlerKey(TaskKind.STOP, TaskKind.DOCKYARD)


def test_stop_tasks_of_dockyard_instances_are_told_apart() -> None:
    assert is_dockyard_stop({"kind": "stop", "spec": {"dockyard": SPEC}})
    assert not is_dockyard_stop({"kind": "stop", "spec": None})
    assert not is_dockyard_stop({"kind": "stop"})
