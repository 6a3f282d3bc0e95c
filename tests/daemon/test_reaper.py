"""The reaper keeps up with a burst: finished Pods are reaped several at a time, never more
than its bound, and a Pod whose log cannot be saved is tried again later."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from nymph.daemon.audit import AuditLog
from nymph.daemon.logfollow import LogFollowers
from nymph.daemon.metrics import Metrics
from nymph.daemon.outbox import Outbox
from nymph.daemon.podreaper import REAP_CONCURRENCY, Reaper
from nymph.daemon.settings import WorkSettings
from nymph.daemon.tracker import Track, Tracker
from nymph.daemon.workdirs import Workdirs
from nymph.launch.logcursor import Cursor
from nymph.launch.state import InstanceState, Reason
from tests.support.watch_cache import WatchCache


class SlowApplier:
    """Each log read and delete takes ``delay``; counts how many run at once."""

    name = "fake"

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.running = 0
        self.most = 0
        self.deleted: list[str] = []
        self.logs_read: list[str] = []
        self.uids: dict[str, str | None] = {}

    async def _call(self) -> None:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.running -= 1

    async def pod_logs(self, *, namespace: str, name: str, limit_bytes: int) -> str:
        await self._call()
        self.logs_read.append(name)
        return f"log of {name}"

    async def delete_pod(
        self, *, namespace: str, name: str, grace_seconds: int | None, uid: str | None = None
    ) -> bool:
        await self._call()
        self.deleted.append(name)
        self.uids[name] = uid
        return True


def _reaper(
    tmp: Path,
    applier: SlowApplier,
    *,
    outbox: Outbox | None = None,
    log_shipped: Callable[[str], bool] | None = None,
) -> tuple[Reaper, Tracker]:
    metrics = Metrics()
    outbox = outbox or Outbox(tmp / "state")
    workdirs = Workdirs(root=tmp)
    tracker = Tracker(node="node-a", outbox=outbox, metrics=metrics, workdirs=workdirs)
    reaper = Reaper(
        settings=WorkSettings(root=tmp, reap_after_seconds=1.0),
        node="node-a",
        tracker=tracker,
        applier=applier,  # type: ignore[arg-type]
        outbox=outbox,
        workdirs=workdirs,
        audit=AuditLog(tmp / "audit.jsonl"),
        metrics=metrics,
        log_shipped=log_shipped,
    )
    return reaper, tracker


def _finished(tracker: Tracker, count: int, *, at: float) -> list[str]:
    names = [f"lakeshore-{i:08x}" for i in range(count)]
    for name in names:
        tracker.tracks[name] = Track(
            namespace="jobs", last=(InstanceState.STOPPED.value, Reason.COMPLETED.value), finished_at=at
        )
    return names


async def test_a_burst_of_finished_pods_is_reaped_concurrently_within_the_bound(tmp_path: Path) -> None:
    applier = SlowApplier(delay=0.05)
    reaper, tracker = _reaper(tmp_path, applier)
    names = _finished(tracker, 5 * REAP_CONCURRENCY, at=0.0)
    for name in names:
        (tmp_path / "work" / name).mkdir(parents=True)
    t0 = time.monotonic()
    assert await reaper.reap_due(now=100.0) == len(names)
    elapsed = time.monotonic() - t0
    assert sorted(applier.deleted) == names
    assert not any((tmp_path / "work" / n).exists() for n in names)
    assert applier.most == REAP_CONCURRENCY
    # One at a time it would take 2 calls x 0.05 s x 40 = 4 s.
    assert elapsed < 2 * 0.05 * len(names) / 2
    # Nothing is due twice: reaped tracks are marked, a second pass starts nothing new.
    applier.deleted.clear()
    await reaper.reap_due(now=100.0)
    assert applier.deleted == []


async def test_only_due_pods_are_reaped(tmp_path: Path) -> None:
    applier = SlowApplier(delay=0.0)
    reaper, tracker = _reaper(tmp_path, applier)
    old = _finished(tracker, 3, at=0.0)
    tracker.tracks["lakeshore-ffffffff"] = Track(namespace="jobs", finished_at=99.5)
    tracker.tracks["lakeshore-eeeeeeee"] = Track(namespace="jobs")  # still running
    assert await reaper.reap_due(now=100.0) == 3
    assert sorted(applier.deleted) == old


async def test_a_pod_whose_log_cannot_be_saved_is_left_for_a_later_turn(tmp_path: Path) -> None:
    def refuse(_path: Path, _data: bytes) -> None:
        raise OSError(28, "No space left on device")

    applier = SlowApplier(delay=0.0)
    outbox = Outbox(tmp_path / "state", memory_max=0, write=refuse)
    reaper, tracker = _reaper(tmp_path, applier, outbox=outbox)
    (name,) = _finished(tracker, 1, at=0.0)
    await reaper.reap_due(now=100.0)
    assert tracker.tracks[name].reaping is False and applier.deleted == []
    assert reaper.disk.ok is False


async def test_a_pod_whose_log_was_shipped_whole_is_reaped_without_reading_its_log_again(
    tmp_path: Path,
) -> None:
    """Once the live follower shipped a Pod's log to its end, with output, the queue serves that
    log: reaping reads no tail and uploads none. A Pod whose stream shipped no bytes (the log
    could not be read while it ran) or did not reach its end still has its tail kept."""
    applier = SlowApplier(delay=0.0)
    outbox = Outbox(tmp_path / "state")
    metrics = Metrics()
    followers = LogFollowers(
        api=None,  # type: ignore[arg-type]  # no follower runs here: only the cursors are read
        outbox=outbox,
        tracker=Tracker(node="node-a", outbox=outbox, metrics=metrics, workdirs=Workdirs(root=tmp_path)),
        state_dir=tmp_path / "state",
    )
    reaper, tracker = _reaper(tmp_path, applier, outbox=outbox, log_shipped=followers.shipped)
    whole, empty, partway, unfollowed = _finished(tracker, 4, at=0.0)
    followers.save(whole, Cursor(offset=120), final=True)
    followers.save(empty, Cursor(offset=0), final=True)  # a final note, no output
    followers.save(partway, Cursor(offset=64), final=False)
    before = outbox.pending
    assert await reaper.reap_due(now=100.0) == 4
    assert sorted(applier.logs_read) == sorted([empty, partway, unfollowed])
    assert outbox.pending - before == 3  # one tail each, none for the whole log
    assert sorted(applier.deleted) == sorted([whole, empty, partway, unfollowed])
    followers.cursors.close()


async def test_the_reaper_binds_each_delete_to_the_pod_its_watch_saw(tmp_path: Path) -> None:
    """A reaped Pod is deleted by the uid the watch cache holds for it (no read of the Pod
    first); a Pod the cache no longer holds is deleted without one (the applier reads it)."""
    applier = SlowApplier(delay=0.0)
    reaper, tracker = _reaper(tmp_path, applier)
    seen, unseen = _finished(tracker, 2, at=0.0)
    cache = WatchCache("jobs", {seen: {"metadata": {"name": seen, "uid": "7f3c-uid-of-seen"}}})
    tracker.follow(cache)
    assert await reaper.reap_due(now=100.0) == 2
    assert applier.uids == {seen: "7f3c-uid-of-seen", unseen: None}
