"""The direct path's records on a real SQLite database: a version of a Pod applied once (by the
create's answer or by the watch) is not written again when the watch delivers it again (the
ADDED that repeats a create's answer, the unchanged Pods of a relist); a new version, a
deletion, and a Pod after its deletion or reaping are written."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from nymph.queue.db import Database
from nymph.queue.direct.records import DirectRecords


def _pod(name: str, version: str, phase: str = "Pending") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "team-a", "resourceVersion": version},
        "spec": {"nodeName": "node-1"},
        "status": {"phase": phase},
    }


@pytest.fixture
async def opened(tmp_path: Path) -> AsyncIterator[tuple[Database, DirectRecords]]:
    db = Database(path=tmp_path / "q.db")
    await db.open()
    try:
        yield db, DirectRecords(db=db)
    finally:
        await db.close()


async def test_a_pod_version_applied_once_is_not_written_again(
    opened: tuple[Database, DirectRecords],
) -> None:
    db, records = opened
    await records.apply_pod(ns="team-a", pod=_pod("i-1", "10"), deleted=False, ts=1.0)
    written = db.commits
    for _ in range(3):  # a relist after a reconnect, and again
        assert await records.apply_pod(ns="team-a", pod=_pod("i-1", "10"), deleted=False, ts=2.0) is None
    assert db.commits == written
    await records.apply_pod(ns="team-a", pod=_pod("i-1", "11", "Running"), deleted=False, ts=3.0)
    assert db.commits == written + 1
    # another Pod's same version number is another object's
    await records.apply_pod(ns="team-a", pod=_pod("i-2", "11"), deleted=False, ts=3.0)
    assert db.commits == written + 2


async def test_the_watch_added_that_repeats_the_create_answer_writes_nothing(
    opened: tuple[Database, DirectRecords],
) -> None:
    db, records = opened
    created = _pod("i-1", "20")
    await records.created(
        ns="team-a",
        pod=created,
        ts=1.0,
        accepted={"instanceId": "i-1", "state": "queued", "providerName": "p", "launchedAt": ""},
        keyed=False,
    )
    written = db.commits
    await records.apply_pod(ns="team-a", pod=_pod("i-1", "20"), deleted=False, ts=1.5)
    assert db.commits == written
    await records.apply_pod(ns="team-a", pod=_pod("i-1", "21", "Running"), deleted=False, ts=2.0)
    assert db.commits == written + 1


async def test_a_deletion_is_always_written_and_forgets_the_version(
    opened: tuple[Database, DirectRecords],
) -> None:
    db, records = opened
    await records.apply_pod(ns="team-a", pod=_pod("i-1", "30"), deleted=False, ts=1.0)
    written = db.commits
    await records.apply_pod(ns="team-a", pod=_pod("i-1", "30"), deleted=True, ts=2.0)
    assert db.commits == written + 1
    # a Pod of the same name made again (the same version cannot come back, but the memory
    # of the old one is gone with it)
    await records.apply_pod(ns="team-a", pod=_pod("i-1", "30"), deleted=False, ts=3.0)
    assert db.commits == written + 2


async def test_a_pod_found_gone_or_reaped_is_forgotten(opened: tuple[Database, DirectRecords]) -> None:
    db, records = opened
    for name in ("i-1", "i-2"):
        await records.apply_pod(ns="team-a", pod=_pod(name, "40"), deleted=False, ts=1.0)
    await records.gone(instance_id="i-1", ts=2.0)
    await records.mark_reaped(instance_id="i-2", ts=2.0)
    written = db.commits
    for name in ("i-1", "i-2"):
        await records.apply_pod(ns="team-a", pod=_pod(name, "40"), deleted=False, ts=3.0)
    assert db.commits == written + 2


async def test_a_pod_without_a_version_is_always_written(opened: tuple[Database, DirectRecords]) -> None:
    db, records = opened
    pod = _pod("i-1", "")
    await records.apply_pod(ns="team-a", pod=pod, deleted=False, ts=1.0)
    written = db.commits
    await records.apply_pod(ns="team-a", pod=pod, deleted=False, ts=2.0)
    assert db.commits == written + 1
