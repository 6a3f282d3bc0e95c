"""The daemon stops a Pod whose image cannot be pulled once its image-pull timeout has passed:
the instance is reported stopped / ImagePull with what to check and the Pod is deleted; the
clock starts when the daemon first sees the failure and survives a daemon restart (no cluster)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nymph.daemon.audit import AuditLog
from nymph.daemon.metrics import Metrics
from nymph.daemon.outbox import Outbox
from nymph.daemon.pullwatch import PullWatch
from nymph.daemon.tracker import Tracker
from nymph.daemon.workdirs import Workdirs
from nymph.launch.pullwait import ANNOTATION_PULL_TIMEOUT
from nymph.launch.render import HOSTNAME_LABEL
from tests.support.fakeclock import FakeClock
from tests.support.watch_cache import WatchCache

IID = "lakeshore-0123abcd"


def pod(
    waiting: str | None = "ErrImagePull", *, phase: str = "Pending", timeout: str = "10"
) -> dict[str, Any]:
    term = {"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "In", "values": ["node-a"]}]}
    status: dict[str, Any] = {"phase": phase}
    if waiting:
        status["containerStatuses"] = [
            {
                "name": "user",
                "state": {"waiting": {"reason": waiting, "message": "dial tcp: connection refused"}},
            }
        ]
    return {
        "metadata": {"name": IID, "namespace": "jobs", "annotations": {ANNOTATION_PULL_TIMEOUT: timeout}},
        "spec": {
            "containers": [{"name": "user", "image": "localhost:1/nope:latest"}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
                }
            },
        },
        "status": status,
    }


class Deleter:
    def __init__(self) -> None:
        self.deleted: list[tuple[str, int | None]] = []

    async def delete_pod(
        self, *, namespace: str, name: str, grace_seconds: int | None, uid: str | None = None
    ) -> bool:
        self.deleted.append((name, grace_seconds))
        return True


def setup(tmp_path: Path, clock: FakeClock) -> tuple[PullWatch, Tracker, WatchCache, Deleter]:
    tracker = Tracker(
        node="node-a", outbox=Outbox(tmp_path / "state"), metrics=Metrics(), workdirs=Workdirs(root=tmp_path)
    )
    cache = WatchCache()
    tracker.follow(cache)
    deleter = Deleter()
    watch = PullWatch(
        tracker=tracker,
        applier=deleter,  # type: ignore[arg-type]
        audit=AuditLog(tmp_path / "audit.jsonl"),
        state_dir=tmp_path / "state",
        clock=clock,
    )
    return watch, tracker, cache, deleter


async def event(watch: PullWatch, tracker: Tracker, cache: WatchCache, kind: str, p: dict[str, Any]) -> None:
    if kind == "DELETED":
        cache.cache.pop(p["metadata"]["name"], None)
    else:
        cache.cache[p["metadata"]["name"]] = p
    await watch.on_pod_event(kind, p)
    await tracker.on_pod_event(kind, p)


def reports(tracker: Tracker) -> list[tuple[str, str | None, str | None]]:
    return [(i["state"], i["reason"], i["message"]) for i in tracker.outbox.mem if i["kind"] == "report"]


async def test_a_pod_failing_its_pull_past_the_timeout_is_stopped_and_deleted(tmp_path: Path) -> None:
    """Before the timeout nothing happens; after it the instance is stopped / ImagePull with a
    message naming the image and the time, and its Pod is deleted at once; its going adds nothing."""
    clock = FakeClock(1000.0)
    watch, tracker, cache, deleter = setup(tmp_path, clock)
    await event(watch, tracker, cache, "ADDED", pod())
    clock.now = 1005.0
    await event(watch, tracker, cache, "MODIFIED", pod("ImagePullBackOff"))
    assert await watch.check(now=1009.0) == []
    assert await watch.check(now=1010.5) == [IID]
    assert deleter.deleted == [(IID, 0)]
    state, reason, message = reports(tracker)[-1]
    assert (state, reason) == ("stopped", "ImagePull")
    assert message is not None and "'localhost:1/nope:latest' could not be pulled for 10s" in message
    await event(watch, tracker, cache, "DELETED", pod("ImagePullBackOff"))
    assert reports(tracker)[-1][:2] == ("stopped", "ImagePull")
    assert [r for r in reports(tracker) if r[0] == "stopped"] == [reports(tracker)[-1]]
    assert await watch.check(now=2000.0) == []


async def test_a_pull_that_recovers_clears_the_clock(tmp_path: Path) -> None:
    """A Pod whose pull works after a failure (it runs) is never stopped for it."""
    clock = FakeClock(1000.0)
    watch, tracker, cache, deleter = setup(tmp_path, clock)
    await event(watch, tracker, cache, "ADDED", pod())
    clock.now = 1005.0
    await event(watch, tracker, cache, "MODIFIED", pod(None, phase="Running"))
    assert await watch.check(now=1100.0) == []
    assert deleter.deleted == []


async def test_a_stop_requested_pod_is_left_to_the_stop(tmp_path: Path) -> None:
    """A Pod a user is stopping is not stopped a second time for its pull."""
    clock = FakeClock(1000.0)
    watch, tracker, cache, deleter = setup(tmp_path, clock)
    await event(watch, tracker, cache, "ADDED", pod())
    tracker.tracks[IID].stop_requested = True
    assert await watch.check(now=1100.0) == []
    assert deleter.deleted == []


async def test_the_clock_survives_a_daemon_restart(tmp_path: Path) -> None:
    """A restarted daemon that finds the Pod still failing keeps counting from the first failure."""
    clock = FakeClock(1000.0)
    watch, tracker, cache, _ = setup(tmp_path, clock)
    await event(watch, tracker, cache, "ADDED", pod())
    clock.now = 1008.0
    watch2, tracker2, cache2, deleter2 = setup(tmp_path, clock)
    await event(watch2, tracker2, cache2, "ADDED", pod("ImagePullBackOff"))
    assert watch2.since[IID] == 1000.0
    assert await watch2.check(now=1010.0) == [IID]
    assert deleter2.deleted == [(IID, 0)]
