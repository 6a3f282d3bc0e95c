"""The tracker's event-to-report rules, on plain Pod dicts (no cluster)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nymph.daemon.metrics import Metrics
from nymph.daemon.outbox import Outbox
from nymph.daemon.tracker import Report, Track, Tracker, decide_event, owned, should_report
from nymph.daemon.workdirs import Workdirs
from nymph.launch.render import HOSTNAME_LABEL
from nymph.launch.state import InstanceState, Reason

IID = "lakeshore-0123abcd"


def pod(
    phase: str | None = "Running", *, node: str | None = "node-a", deleting: bool = False, **status: Any
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": IID, "namespace": "jobs"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    spec: dict[str, Any] = {}
    if node:
        term = {"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "In", "values": [node]}]}
        spec["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
        }
    return {"metadata": meta, "spec": spec, "status": {"phase": phase, **status}}


def stopped_track(**kw: Any) -> Track:
    return Track(namespace="jobs", last=(InstanceState.STOPPED.value, Reason.COMPLETED.value), **kw)


# --- pure decisions ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("phase", "state"),
    [
        ("Pending", InstanceState.STARTING),
        ("Running", InstanceState.RUNNING),
        ("Succeeded", InstanceState.STOPPED),
    ],
)
def test_a_pod_phase_becomes_the_reported_state(phase: str, state: InstanceState) -> None:
    d = decide_event("MODIFIED", pod(phase), Track(namespace="jobs"))
    assert d.report is not None and d.report.state is state
    assert not d.forget and not d.remove_workdir
    assert d.finished is (state is InstanceState.STOPPED)


def test_a_finished_pod_starts_the_reaper_clock_once() -> None:
    track = Track(namespace="jobs", finished_at=12.0)
    assert not decide_event("MODIFIED", pod("Failed"), track).finished


def test_an_evicted_pod_says_why() -> None:
    d = decide_event(
        "MODIFIED", pod("Failed", reason="Evicted", message="low on memory"), Track(namespace="jobs")
    )
    assert d.report == Report(InstanceState.STOPPED, Reason.EVICTED, "low on memory")


def test_stopping_after_stopped_is_not_reported() -> None:
    d = decide_event("MODIFIED", pod("Succeeded", deleting=True), stopped_track())
    assert d.report is None
    d = decide_event("MODIFIED", pod("Running", deleting=True), Track(namespace="jobs"))
    assert d.report is not None and d.report.state is InstanceState.STOPPING


def test_a_pod_the_cluster_deleted_says_which_controller_and_why() -> None:
    """The Pod GC removing a Pod whose node is gone is NodeLost, with the controller's words; a
    DisruptionTarget condition no longer true is a plain deletion."""
    cond = {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "DeletionByPodGC",
        "message": "PodGC: node no longer exists",
    }
    d = decide_event("DELETED", pod("Pending", conditions=[cond]), Track(namespace="jobs"))
    assert d.report is not None and d.report.reason is Reason.NODE_LOST
    assert d.report.message == "the cluster deleted the Pod (DeletionByPodGC: PodGC: node no longer exists)"
    old = {**cond, "status": "False"}
    d = decide_event("DELETED", pod("Pending", conditions=[old]), Track(namespace="jobs"))
    assert d.report is not None and d.report.message == "the Pod was deleted outside nymph"


def test_a_deleted_pod_nobody_asked_to_stop_is_reported_deleted() -> None:
    d = decide_event("DELETED", pod(), Track(namespace="jobs", last=("running", None)))
    assert d.report == Report(InstanceState.STOPPED, Reason.DELETED, "the Pod was deleted outside nymph")
    assert d.forget and d.remove_workdir


def test_a_pod_that_ended_before_it_was_deleted_reports_its_end_not_a_deletion() -> None:
    """Deleted before this daemon reported its end (a daemon restarted in between, or someone
    removed the finished Pod): the end the Pod shows is the instance's, exit code included."""
    done = {"name": "user", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
    d = decide_event(
        "DELETED",
        pod("Succeeded", deleting=True, containerStatuses=[done]),
        Track(namespace="jobs", last=("running", None)),
    )
    assert d.report == Report(InstanceState.STOPPED, Reason.COMPLETED, "")
    assert d.report.termination == (0, "Completed", "") and d.forget and d.remove_workdir
    failed = {"name": "user", "state": {"terminated": {"exitCode": 3, "reason": "Error"}}}
    d = decide_event("DELETED", pod("Failed", containerStatuses=[failed]), Track(namespace="jobs"))
    assert (
        d.report is not None and d.report.reason is Reason.ERROR and d.report.termination == (3, "Error", "")
    )
    # Still running when it went: a deletion; asked to stop: stopped on request.
    d = decide_event(
        "DELETED", pod("Running", deleting=True), Track(namespace="jobs", last=("running", None))
    )
    assert d.report is not None and d.report.reason is Reason.DELETED
    d = decide_event("DELETED", pod("Succeeded"), Track(namespace="jobs", stop_requested=True))
    assert d.report is not None and d.report.reason is Reason.STOPPED


def test_a_deleted_pod_after_a_stop_request_is_stopped_on_request() -> None:
    d = decide_event("DELETED", pod(), Track(namespace="jobs", stop_requested=True))
    assert d.report == Report(InstanceState.STOPPED, Reason.STOPPED, "stopped on request")


def test_deleting_a_finished_pod_reports_nothing_new() -> None:
    d = decide_event("DELETED", pod("Succeeded"), stopped_track())
    assert d.report is None and d.forget and d.remove_workdir


def test_a_reaped_pod_is_forgotten_silently_the_reaper_removes_its_workdir() -> None:
    d = decide_event("DELETED", pod("Succeeded"), stopped_track(reaping=True))
    assert d.report is None and d.forget and not d.remove_workdir


def test_reports_are_deduplicated_and_stopped_is_final() -> None:
    running = Report(InstanceState.RUNNING)
    assert should_report(Track(namespace="jobs"), running)
    assert not should_report(Track(namespace="jobs", last=("running", None)), running)
    assert should_report(Track(namespace="jobs", last=("running", None)), Report(InstanceState.STOPPING))
    assert not should_report(stopped_track(), Report(InstanceState.STOPPED, Reason.DELETED))


def test_ownership_follows_the_pin() -> None:
    assert owned(pod(node="node-a"), node="node-a")
    assert not owned(pod(node="node-b"), node="node-a")
    assert owned(pod(node=None), node="node-a")  # not pinned, not bound: ours to follow
    assert owned(pod(node="node-b"), node=None)  # a daemon without a node follows every Pod


# --- the tracker applies them -------------------------------------------------------------------


def make_tracker(tmp_path: Path, node: str | None = "node-a") -> Tracker:
    return Tracker(
        node=node, outbox=Outbox(tmp_path / "state"), metrics=Metrics(), workdirs=Workdirs(root=tmp_path)
    )


def sent(t: Tracker) -> list[tuple[str, str | None, str | None]]:
    return [(i["state"], i["reason"], i["node"]) for i in t.outbox.mem if i["kind"] == "report"]


async def test_a_pod_lifecycle_is_reported_once_per_change(tmp_path: Path) -> None:
    t = make_tracker(tmp_path)
    t.workdirs.create(IID)
    for kind, p in [
        ("ADDED", pod("Pending")),
        ("MODIFIED", pod("Running")),
        ("MODIFIED", pod("Running")),
        ("MODIFIED", pod("Succeeded")),
        ("MODIFIED", pod("Succeeded", deleting=True)),
        ("DELETED", pod("Succeeded")),
    ]:
        await t.on_pod_event(kind, p)
    assert sent(t) == [
        ("starting", None, "node-a"),
        ("running", None, "node-a"),
        ("stopped", "Completed", "node-a"),
    ]
    assert IID not in t.tracks and not (tmp_path / "work" / IID).exists()


async def test_another_nodes_pod_is_ignored(tmp_path: Path) -> None:
    t = make_tracker(tmp_path)
    await t.on_pod_event("ADDED", pod(node="node-b"))
    assert sent(t) == [] and t.tracks == {}


async def test_unpinned_reports_carry_no_node_and_skip_the_tracks(tmp_path: Path) -> None:
    t = make_tracker(tmp_path)
    t.report_unpinned("dockyard-x", Report(InstanceState.RUNNING, None, "5 objects applied"))
    assert sent(t) == [("running", None, None)] and t.tracks == {}
