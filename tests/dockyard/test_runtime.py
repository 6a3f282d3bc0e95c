"""A runtime cap on a dockyard launch: the RayJob's ``spec.activeDeadlineSeconds``, and nothing
else of the render changes (no cap: the output is what it always was)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from nymph.daemon.tasks.dockyard import render
from nymph.dockyard.errors import DockyardConfigError
from nymph.dockyard.render.manifests import to_yaml
from nymph.dockyard.render.task import dockyard_task_manifests

EXAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "examples"
SPEC: dict[str, Any] = {
    "recipe": yaml.safe_load((EXAMPLES / "dockyard-grpo-vllm.yaml").read_text()),
    "infra": yaml.safe_load((EXAMPLES / "dockyard-grpo-vllm.infra.yaml").read_text()),
    "overrides": [],
    "namespace": "jobs",
}


def _without_deadline(manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = copy.deepcopy(manifests)
    for m in out:
        if m["kind"] == "RayJob":
            m["spec"].pop("activeDeadlineSeconds", None)
    return out


def test_no_cap_renders_byte_identical_output() -> None:
    plain = dockyard_task_manifests(
        recipe=SPEC["recipe"], infra=SPEC["infra"], overrides=[], namespace="jobs"
    )
    assert to_yaml(render(SPEC, namespace="jobs")) == to_yaml(plain)
    assert to_yaml(
        dockyard_task_manifests(
            recipe=SPEC["recipe"], infra=SPEC["infra"], overrides=[], namespace="jobs", max_runtime=None
        )
    ) == to_yaml(plain)
    assert all("activeDeadlineSeconds" not in m["spec"] for m in plain)


@pytest.mark.parametrize(("raw", "seconds"), [(7200, 7200), ("2h", 7200), ("90", 90)])
def test_a_cap_in_the_task_becomes_the_rayjobs_active_deadline(raw: object, seconds: int) -> None:
    plain = render(SPEC, namespace="jobs")
    capped = render({**SPEC, "maxRuntime": raw}, namespace="jobs")
    [job] = [m for m in capped if m["kind"] == "RayJob"]
    assert job["spec"]["activeDeadlineSeconds"] == seconds
    assert _without_deadline(capped) == plain  # nothing else moved


@pytest.mark.parametrize("bad", [0, -1, "soon", True, 1.5])
def test_a_bad_cap_in_the_task_is_refused_naming_it(bad: object) -> None:
    with pytest.raises(DockyardConfigError) as err:
        render({**SPEC, "maxRuntime": bad}, namespace="jobs")
    assert err.value.path == "maxRuntime"


def test_a_bringup_cluster_has_no_deadline() -> None:
    def bringup(max_runtime: int | None) -> str:
        return to_yaml(
            dockyard_task_manifests(
                recipe=SPEC["recipe"],
                infra=SPEC["infra"],
                overrides=["infra.launch.mode=bringup"],
                namespace="jobs",
                max_runtime=max_runtime,
            )
        )

    assert "kind: RayCluster" in bringup(None)
    assert bringup(600) == bringup(None)
