"""How a dockyard RayJob's status becomes the instance's end, and how a launch's RayJob names
the launch's other objects (pure)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nymph.daemon.rayjobends import launch_of, rayjob_end
from nymph.dockyard.ownership import LAUNCH_LABEL, POOL_ANNOTATION, companions, mark
from nymph.launch.state import InstanceState, Reason

IID = "lakeshore-0a1b2c3d"


def job(**status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "grpo", "labels": {LAUNCH_LABEL: IID}}, "status": status}


@pytest.mark.parametrize(
    "status",
    [{}, {"jobDeploymentStatus": "Initializing"}, {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"},
     {"jobDeploymentStatus": "Suspended"}, {"jobDeploymentStatus": "Retrying", "jobStatus": "FAILED"}],
)  # fmt: skip
def test_a_rayjob_that_has_not_ended_reports_nothing(status: dict[str, Any]) -> None:
    """Only Complete and Failed end an instance; a retrying or suspended RayJob is still live."""
    assert rayjob_end(job(**status)) is None
    assert rayjob_end({"metadata": {"name": "x"}}) is None


def test_success_failure_and_deadline_map_to_reasons() -> None:
    """SUCCEEDED is Completed; a failure is Error with KubeRay's message; KubeRay's deadline
    reason is DeadlineExceeded."""
    ok = rayjob_end(job(jobDeploymentStatus="Complete", jobStatus="SUCCEEDED"))
    assert ok is not None and (ok.state, ok.reason, ok.message) == (
        InstanceState.STOPPED,
        Reason.COMPLETED,
        "RayJob grpo succeeded",
    )
    failed = rayjob_end(job(jobDeploymentStatus="Failed", jobStatus="FAILED", message="driver exited 1"))
    assert failed is not None and (failed.reason, failed.message) == (
        Reason.ERROR,
        "RayJob grpo failed (job FAILED): driver exited 1",
    )
    late = rayjob_end(job(jobDeploymentStatus="Failed", reason="DeadlineExceeded"))
    assert late is not None and late.reason is Reason.DEADLINE_EXCEEDED
    stopped = rayjob_end(job(jobDeploymentStatus="Complete", jobStatus="STOPPED"))
    assert stopped is not None and stopped.reason is Reason.ERROR


def test_the_launch_label_must_be_an_instance_id() -> None:
    assert launch_of(job()) == IID
    assert launch_of({"metadata": {"labels": {LAUNCH_LABEL: "not-an-id"}}}) is None
    assert launch_of({}) is None


def test_mark_names_the_other_objects_on_the_rayjob_and_companions_reads_them() -> None:
    """The RayJob carries the launch's other objects; read back, they are name-only manifests
    in the RayJob's namespace; a bad annotation names none."""
    manifests = [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "sbx", "namespace": "t"}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "sbx", "namespace": "t"}},
        {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "grpo", "namespace": "t"}},
    ]
    marked = mark(manifests, launch=IID)
    assert all(POOL_ANNOTATION not in (m["metadata"].get("annotations") or {}) for m in marked[:2])
    assert json.loads(marked[2]["metadata"]["annotations"][POOL_ANNOTATION]) == [
        {"apiVersion": "apps/v1", "kind": "Deployment", "name": "sbx"},
        {"apiVersion": "v1", "kind": "Service", "name": "sbx"},
    ]
    assert companions(marked[2]) == [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "sbx", "namespace": "t"}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "sbx", "namespace": "t"}},
    ]
    for bad in ("{", "[1, 2]", json.dumps([{"kind": "Service"}]), json.dumps({"a": 1})):
        assert companions({"metadata": {"namespace": "t", "annotations": {POOL_ANNOTATION: bad}}}) == []
    assert mark(manifests[:2], launch=IID)[0]["metadata"].get("annotations") is None
