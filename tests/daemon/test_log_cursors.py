"""The daemon's log followers and their cursors: a Pod whose log was shipped to its end is not
followed again at its later changes, by this daemon or one started afresh (from the mark book,
without reading the disk at each change); a new Pod of the same name (after the old one was
deleted) is followed afresh; cursor files of an earlier version are taken in."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from nymph.daemon.logfollow import LogFollowers
from nymph.daemon.metrics import Metrics
from nymph.daemon.outbox import Outbox
from nymph.daemon.tracker import Tracker
from nymph.daemon.workdirs import Workdirs
from nymph.launch.logcursor import Cursor, parse_stamp
from tests.daemon.test_tracker import IID, pod


def running() -> dict[str, Any]:
    return pod("Running", containerStatuses=[{"name": "user", "state": {"running": {"startedAt": "x"}}}])


def followers(tmp_path: Path) -> LogFollowers:
    outbox = Outbox(tmp_path / "state")
    tracker = Tracker(node="node-a", outbox=outbox, metrics=Metrics(), workdirs=Workdirs(root=tmp_path))
    # No API client: a follower started here fails at once, which is all these tests need
    # (that one was started, or not).
    return LogFollowers(api=None, outbox=outbox, tracker=tracker, state_dir=tmp_path / "state")  # type: ignore[arg-type]


def no_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("the disk was read")

    monkeypatch.setattr(os, "open", refused)
    monkeypatch.setattr(Path, "read_text", refused)
    monkeypatch.setattr(Path, "read_bytes", refused)


async def test_a_log_shipped_to_its_end_is_not_followed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = followers(tmp_path)
    f.save(IID, Cursor(), final=True)
    g = followers(tmp_path)  # a daemon started afresh, from what the first one wrote
    with monkeypatch.context() as m:
        no_disk(m)
        for _ in range(3):
            await f.on_pod_event("MODIFIED", running())
            await g.on_pod_event("MODIFIED", running())
    assert f.tasks == {} and g.tasks == {}


async def test_a_log_not_shipped_to_its_end_is_followed_on(tmp_path: Path) -> None:
    f = followers(tmp_path)
    f.save(IID, Cursor(), final=False)
    g = followers(tmp_path)
    await g.on_pod_event("MODIFIED", running())
    try:
        assert IID in g.tasks
    finally:
        await g.close()


async def test_a_new_pod_of_a_deleted_ones_name_is_followed_again(tmp_path: Path) -> None:
    f = followers(tmp_path)
    f.save(IID, Cursor(), final=True)
    await f.on_pod_event("DELETED", running())
    assert followers(tmp_path).cursors.get(IID) is None  # forgotten on disk too
    await f.on_pod_event("ADDED", running())
    try:
        assert IID in f.tasks
    finally:
        await f.close()


async def test_cursor_files_of_an_earlier_version_are_taken_in(tmp_path: Path) -> None:
    old = tmp_path / "state" / "logs"
    old.mkdir(parents=True)
    cursor = Cursor(offset=120, stamp=parse_stamp("2026-01-01T00:00:00.000000001Z"), seen=2)
    (old / f"{IID}.json").write_text(json.dumps({"cursor": cursor.dump(), "final": True}))
    (old / ".other.json.tmp").write_text("half")
    f = followers(tmp_path)
    assert f._load(IID) == (cursor, True)
    assert not old.exists()  # taken in whole, the directory gone
    await f.on_pod_event("MODIFIED", running())
    assert f.tasks == {}
