from __future__ import annotations

from typing import Any

import pytest

from nymph.launch.state import InstanceState, Reason, pod_reason, pod_state


def pod(phase: str | None = None, deleting: bool = False, **status: Any) -> dict[str, Any]:
    p: dict[str, Any] = {"metadata": {"name": "x"}, "status": dict(status)}
    if phase:
        p["status"]["phase"] = phase
    if deleting:
        p["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return p


@pytest.mark.parametrize(
    ("phase", "state"),
    [
        ("Pending", InstanceState.STARTING),
        ("Running", InstanceState.RUNNING),
        ("Succeeded", InstanceState.STOPPED),
        ("Failed", InstanceState.STOPPED),
        ("Unknown", InstanceState.UNKNOWN),
        ("Weird", InstanceState.UNKNOWN),
        (None, InstanceState.UNKNOWN),
    ],
)
def test_phase_mapping(phase: str | None, state: InstanceState) -> None:
    assert pod_state(pod(phase)) is state


@pytest.mark.parametrize("phase", ["Pending", "Running", "Succeeded", "Failed", None])
def test_deletion_timestamp_means_stopping_whatever_the_phase(phase: str | None) -> None:
    assert pod_state(pod(phase, deleting=True)) is InstanceState.STOPPING


def cs(**state: Any) -> dict[str, Any]:
    return {"name": "user", "state": state}


@pytest.mark.parametrize(
    ("p", "reason"),
    [
        (pod("Succeeded"), Reason.COMPLETED),
        (pod("Failed", containerStatuses=[cs(terminated={"exitCode": 2, "reason": "Error"})]), Reason.ERROR),
        (
            pod("Failed", containerStatuses=[cs(terminated={"exitCode": 137, "reason": "OOMKilled"})]),
            Reason.OOM_KILLED,
        ),
        (pod("Failed", reason="Evicted", message="low on memory"), Reason.EVICTED),
        (pod("Failed", reason="DeadlineExceeded"), Reason.DEADLINE_EXCEEDED),
        (pod("Pending", containerStatuses=[cs(waiting={"reason": "ImagePullBackOff"})]), Reason.IMAGE_PULL),
        (pod("Pending", containerStatuses=[cs(waiting={"reason": "ErrImagePull"})]), Reason.IMAGE_PULL),
        (
            pod("Pending", containerStatuses=[cs(waiting={"reason": "CreateContainerConfigError"})]),
            Reason.CREATE_CONTAINER,
        ),
        (
            pod(
                "Pending",
                conditions=[
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/1 nodes",
                    }
                ],
            ),
            Reason.UNSCHEDULABLE,
        ),
        (pod("Failed"), Reason.ERROR),
    ],
)
def test_failure_taxonomy(p: dict[str, Any], reason: Reason) -> None:
    assert pod_reason(p)[0] is reason


def test_healthy_pods_have_no_reason() -> None:
    assert pod_reason(pod("Running", containerStatuses=[cs(running={})])) == (None, "")
    assert pod_reason(pod("Pending")) == (None, "")


def test_error_message_carries_the_exit_code() -> None:
    _, msg = pod_reason(pod("Failed", containerStatuses=[cs(terminated={"exitCode": 3, "reason": "Error"})]))
    assert msg.startswith("exit code 3")


def test_reason_failed_flag() -> None:
    assert not Reason.COMPLETED.failed and not Reason.STOPPED.failed
    assert Reason.OOM_KILLED.failed and Reason.LAUNCH_FAILED.failed
