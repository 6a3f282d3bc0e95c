"""Replica and per-pod request caps on rendered dockyard manifests (pure): what is counted, how a
refusal names the field and the operator flag."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nymph.dockyard.render.limits import (
    ReplicaCap,
    ReplicaLimitError,
    RequestCaps,
    RequestLimitError,
    check_replicas,
    check_requests,
)

CAP = ReplicaCap(max_replicas=10)


def rayjob(*groups: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": "RayJob",
        "metadata": {"name": "x"},
        "spec": {
            "rayClusterSpec": {
                "headGroupSpec": {"template": {"spec": {"containers": [{"name": "head"}]}}},
                "workerGroupSpecs": list(groups),
            }
        },
    }


def deployment(replicas: object, *containers: dict[str, Any]) -> dict[str, Any]:
    pod = {"containers": list(containers) or [{"name": "c"}]}
    return {
        "kind": "Deployment",
        "metadata": {"name": "d"},
        "spec": {"replicas": replicas, "template": {"spec": pod}},
    }


@given(replicas=st.integers(min_value=0, max_value=10**15))
def test_a_deployment_passes_exactly_up_to_the_cap(replicas: int) -> None:
    if replicas <= CAP.max_replicas:
        check_replicas([deployment(replicas)], cap=CAP)
    else:
        with pytest.raises(
            ReplicaLimitError, match=r"Deployment/d spec.replicas: .* \(the queue's --max-replicas\)"
        ):
            check_replicas([deployment(replicas)], cap=CAP)


@given(sizes=st.lists(st.integers(min_value=0, max_value=12), min_size=1, max_size=5))
def test_the_workers_of_one_cluster_count_together(sizes: list[int]) -> None:
    manifest = rayjob(*({"groupName": f"g{i}", "replicas": n} for i, n in enumerate(sizes)))
    if max(sizes) <= CAP.max_replicas and sum(sizes) <= CAP.max_replicas:
        check_replicas([manifest], cap=CAP)
        return
    with pytest.raises(ReplicaLimitError) as info:
        check_replicas([manifest], cap=CAP)
    assert info.value.path is not None and info.value.path.startswith(
        "RayJob/x spec.rayClusterSpec.workerGroupSpecs"
    )


@pytest.mark.parametrize(
    ("group", "path"),
    [
        ({"replicas": 1, "maxReplicas": 11}, "workerGroupSpecs[0].maxReplicas"),
        ({"replicas": 1, "minReplicas": 11}, "workerGroupSpecs[0].minReplicas"),
        ({"replicas": 3, "numOfHosts": 4}, "workerGroupSpecs"),  # 12 pods
        ({"replicas": "3"}, "workerGroupSpecs[0].replicas"),
        ({"replicas": True}, "workerGroupSpecs[0].replicas"),
        ({"replicas": -1}, "workerGroupSpecs[0].replicas"),
    ],
)
def test_each_way_of_asking_for_workers_is_counted(group: dict[str, Any], path: str) -> None:
    with pytest.raises(ReplicaLimitError) as info:
        check_replicas([rayjob(group)], cap=CAP, prefix="dockyard: ")
    assert info.value.path == f"dockyard: RayJob/x spec.rayClusterSpec.{path}"


CAPS = RequestCaps(max_per_pod={"cpu": Fraction(8), "memory": Fraction(16 * 2**30)})


def test_requests_under_the_caps_pass_and_uncapped_resources_are_free() -> None:
    c = {"name": "c", "resources": {"requests": {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "64"}}}
    check_requests([deployment(1, c, c)], caps=CAPS)  # 8 cpu, 16Gi in all: at the caps
    check_requests(
        [deployment(1, {"name": "c", "resources": {"requests": {"cpu": "9"}}})], caps=RequestCaps()
    )


@pytest.mark.parametrize(
    ("containers", "path", "needle"),
    [
        (
            [{"resources": {"requests": {"cpu": "9"}}}],
            "containers[0].resources.requests.cpu",
            "asks for 9 cpu",
        ),
        (
            [{"resources": {"limits": {"cpu": "8500m"}}}],
            "containers[0].resources.limits.cpu",
            "asks for 8500m",
        ),
        (
            [
                {"resources": {"requests": {"memory": "10Gi"}}},
                {"resources": {"requests": {"memory": "10Gi"}}},
            ],
            "containers",
            "the containers ask for 20Gi memory",
        ),
        (
            [{"resources": {"requests": {"cpu": "lots"}}}],
            "containers[0].resources.requests.cpu",
            "not a quantity",
        ),
    ],
)
def test_a_pod_over_a_cap_is_refused_naming_the_field(
    containers: list[dict[str, Any]], path: str, needle: str
) -> None:
    with pytest.raises(RequestLimitError) as info:
        check_requests([deployment(1, *containers)], caps=CAPS, prefix="dockyard: ")
    assert info.value.path == f"dockyard: Deployment/d spec.template.spec.{path}"
    assert needle in info.value.message


def test_an_init_container_counts_alone() -> None:
    big_init = {"name": "i", "resources": {"requests": {"cpu": "9"}}}
    manifest = deployment(1, {"name": "c", "resources": {"requests": {"cpu": "1"}}})
    manifest["spec"]["template"]["spec"]["initContainers"] = [big_init]
    with pytest.raises(RequestLimitError) as info:
        check_requests([manifest], caps=CAPS)
    assert info.value.path == "Deployment/d spec.template.spec.initContainers[0].resources.requests.cpu"
