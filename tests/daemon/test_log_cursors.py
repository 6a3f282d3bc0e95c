"""The daemon's log followers and their cursor files: a Pod whose log was shipped to its end is
neither followed nor looked up on disk again at its later changes, and a new Pod of the same
name (after the old one was deleted) is followed afresh."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nymph.daemon.logfollow import LogFollowers
from nymph.daemon.metrics import Metrics
from nymph.daemon.outbox import Outbox
from nymph.daemon.tracker import Tracker
from nymph.daemon.workdirs import Workdirs
from nymph.launch.logcursor import Cursor
from tests.daemon.test_tracker import IID, pod


def running() -> dict[str, Any]:
    return pod("Running", containerStatuses=[{"name": "user", "state": {"running": {"startedAt": "x"}}}])


def followers(tmp_path: Path) -> LogFollowers:
    outbox = Outbox(tmp_path / "state")
    tracker = Tracker(node="node-a", outbox=outbox, metrics=Metrics(), workdirs=Workdirs(root=tmp_path))
    # No API client: a follower started here fails at once, which is all these tests need
    # (that one was started, or not).
    return LogFollowers(api=None, outbox=outbox, tracker=tracker, state_dir=tmp_path / "state")  # type: ignore[arg-type]


async def test_a_log_shipped_to_its_end_is_not_read_back_at_every_later_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = followers(tmp_path)
    f.save(IID, Cursor(), final=True)
    loads: list[str] = []
    real = LogFollowers._load

    def counted(self: LogFollowers, name: str) -> tuple[Cursor, bool]:
        loads.append(name)
        return real(self, name)

    monkeypatch.setattr(LogFollowers, "_load", counted)
    for _ in range(3):
        await f.on_pod_event("MODIFIED", running())
    assert f.tasks == {} and loads == []
    # a daemon started afresh knows it from the file alone
    g = followers(tmp_path)
    await g.on_pod_event("MODIFIED", running())
    assert g.tasks == {} and loads == [IID]


async def test_a_new_pod_of_a_deleted_ones_name_is_followed_again(tmp_path: Path) -> None:
    f = followers(tmp_path)
    f.save(IID, Cursor(), final=True)
    await f.on_pod_event("DELETED", running())
    assert not (tmp_path / "state" / "logs" / f"{IID}.json").exists()
    await f.on_pod_event("ADDED", running())
    try:
        assert IID in f.tasks
    finally:
        await f.close()
