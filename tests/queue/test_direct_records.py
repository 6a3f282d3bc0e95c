"""The direct path's records on a real SQLite database: a version of a Pod applied once (by the
create's answer or by the watch) is not written again when the watch delivers it again (the
ADDED that repeats a create's answer, the unchanged Pods of a relist); a new version, a
deletion, and a Pod after its deletion or reaping are written. A launch recorded here is known
to be direct without a read."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import pytest

from nymph.launch.config import Mode, Provider
from nymph.protocol import LaunchAccepted
from nymph.queue.db import Database
from nymph.queue.direct import records as records_module
from nymph.queue.direct.records import DirectRecords
from nymph.queue.sql import catalog


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


async def _writes(db: Database, *steps: Awaitable[object]) -> int:
    """The write transactions ``steps`` committed, run in turn."""
    before = db.commits
    for step in steps:
        await step
    return db.commits - before


def _apply(records: DirectRecords, pod: dict[str, Any], *, deleted: bool = False) -> Awaitable[object]:
    return records.apply_pod(ns="team-a", pod=pod, deleted=deleted, ts=1.0)


async def test_a_pod_version_applied_once_is_not_written_again(
    opened: tuple[Database, DirectRecords],
) -> None:
    db, records = opened
    assert await _writes(db, _apply(records, _pod("i-1", "10"))) == 1
    # a relist after a reconnect, and again
    assert await _writes(db, _apply(records, _pod("i-1", "10")), _apply(records, _pod("i-1", "10"))) == 0
    assert await _writes(db, _apply(records, _pod("i-1", "11", "Running"))) == 1
    # another Pod's same version number is another object's
    assert await _writes(db, _apply(records, _pod("i-2", "11"))) == 1


async def test_the_watch_added_that_repeats_the_create_answer_writes_nothing(
    opened: tuple[Database, DirectRecords],
) -> None:
    db, records = opened
    accepted: LaunchAccepted = {"instanceId": "i-1", "state": "queued", "providerName": "p", "launchedAt": ""}
    created = records.created(ns="team-a", pod=_pod("i-1", "20"), ts=1.0, accepted=accepted, keyed=False)
    assert await _writes(db, created) == 1
    assert await _writes(db, _apply(records, _pod("i-1", "20"))) == 0
    assert await _writes(db, _apply(records, _pod("i-1", "21", "Running"))) == 1


async def test_a_deletion_is_always_written_and_forgets_the_version(
    opened: tuple[Database, DirectRecords],
) -> None:
    db, records = opened
    await _apply(records, _pod("i-1", "30"))
    assert await _writes(db, _apply(records, _pod("i-1", "30"), deleted=True)) == 1
    # the memory of the deleted Pod is gone with it
    assert await _writes(db, _apply(records, _pod("i-1", "30"))) == 1


async def test_a_pod_found_gone_or_reaped_is_forgotten(opened: tuple[Database, DirectRecords]) -> None:
    db, records = opened
    await _apply(records, _pod("i-1", "40"))
    await _apply(records, _pod("i-2", "40"))
    await records.gone(instance_id="i-1", ts=2.0)
    await records.mark_reaped(instance_id="i-2", ts=2.0)
    assert await _writes(db, _apply(records, _pod("i-1", "40")), _apply(records, _pod("i-2", "40"))) == 2


async def test_a_pod_without_a_version_is_always_written(opened: tuple[Database, DirectRecords]) -> None:
    db, records = opened
    assert await _writes(db, _apply(records, _pod("i-1", "")), _apply(records, _pod("i-1", ""))) == 2


async def _direct_instances(db: Database, *ids: str) -> None:
    def write(c: Any) -> None:
        for iid in ids:
            c.execute(
                "INSERT INTO instances (instance_id, namespace, provider, kube_namespace, state, "
                "launched_at, updated_at, version, requester, dispatch) "
                "VALUES (?, 'team-a', 'p', 'jobs', 'queued', 1, 1, 1, 'r', 'direct')",
                (iid,),
            )

    await db.write(write)


async def _states(db: Database) -> dict[str, str]:
    rows = await db.read(lambda c: c.execute("SELECT instance_id, state FROM instances").fetchall())
    return {r["instance_id"]: r["state"] for r in rows}


async def test_a_watch_batch_is_one_write_in_order_and_each_version_is_remembered(
    opened: tuple[Database, DirectRecords],
) -> None:
    db, records = opened
    await _direct_instances(db, "i-1", "i-2")
    batch = [
        ("MODIFIED", _pod("i-1", "50")),
        ("MODIFIED", _pod("i-2", "50")),
        ("MODIFIED", _pod("i-1", "51", "Running")),
    ]
    before = db.commits
    changed = await records.apply_pods(ns="team-a", changes=batch, ts=2.0)
    assert db.commits - before == 1
    assert changed == ["i-1", "i-2"]
    # in order: i-1's later version is the one that stands
    assert await _states(db) == {"i-1": "running", "i-2": "starting"}
    # a relist delivers the latest versions again: each was remembered, nothing is written
    relist = [("MODIFIED", _pod("i-1", "51", "Running")), ("MODIFIED", _pod("i-2", "50"))]
    assert await _writes(db, records.apply_pods(ns="team-a", changes=relist, ts=3.0)) == 0
    # a deletion in a batch is written even for a version applied already
    assert (
        await _writes(db, records.apply_pods(ns="team-a", changes=[("DELETED", _pod("i-2", "50"))], ts=4.0))
        == 1
    )
    assert (await _states(db))["i-2"] == "stopped"


async def test_a_watch_batch_whose_write_fails_applies_and_remembers_none_of_it(
    opened: tuple[Database, DirectRecords], monkeypatch: pytest.MonkeyPatch
) -> None:
    db, records = opened
    await _direct_instances(db, "i-1", "i-2")
    batch = [("MODIFIED", _pod("i-1", "60", "Running")), ("MODIFIED", _pod("i-2", "60", "Running"))]
    real = records_module.sql.apply_pod
    calls: list[str] = []

    def failing(c: Any, **kw: Any) -> str | None:
        calls.append(kw["pod"]["metadata"]["name"])
        if len(calls) == 2:
            raise RuntimeError("disk I/O error")
        return real(c, **kw)

    monkeypatch.setattr(records_module.sql, "apply_pod", failing)
    with pytest.raises(RuntimeError):
        await records.apply_pods(ns="team-a", changes=batch, ts=2.0)
    # i-1 was written before i-2 failed: rolled back with it
    assert await _states(db) == {"i-1": "queued", "i-2": "queued"}
    monkeypatch.setattr(records_module.sql, "apply_pod", real)
    # delivered again (the watch relists): nothing was taken for applied, so all of it lands
    assert await _writes(db, records.apply_pods(ns="team-a", changes=batch, ts=3.0)) == 1
    assert await _states(db) == {"i-1": "running", "i-2": "running"}


async def _catalog(db: Database) -> None:
    def write(conn: Any) -> None:
        provider = Provider(name="p", kwargs={"namespace": "jobs"}, dispatch="direct")
        catalog.put_provider(conn, ns="team-a", provider=provider, replace=False)
        catalog.put_mode(
            conn, ns="team-a", mode=Mode(name="m", provider="p", fields={"image": "busybox"}), replace=False
        )

    await db.write(write)


async def test_a_launch_recorded_here_is_known_direct_without_a_read(
    opened: tuple[Database, DirectRecords], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The log followers ask at every Pod that starts whether it is a direct launch: for one
    this replica recorded, the answer needs no read; one it forgot (its Pod was refused) is no
    longer known, and one it never recorded is read from the database."""
    db, records = opened
    await _catalog(db)
    launch = {"mode": "m", "script": "x"}
    kept = await records.record_launch(
        ns="team-a", provider="p", body=launch, idempotency_key=None, requester="t", guard=None
    )
    refused = await records.record_launch(
        ns="team-a", provider="p", body=launch, idempotency_key=None, requester="t", guard=None
    )
    reads: list[object] = []
    real = db.read_one

    async def counted(fn: Any) -> Any:
        reads.append(fn)
        return await real(fn)

    monkeypatch.setattr(db, "read_one", counted)
    assert await records.is_direct(instance_id=kept.accepted["instanceId"]) is True
    assert reads == []
    await records.forget(instance_id=refused.accepted["instanceId"])
    assert await records.is_direct(instance_id=refused.accepted["instanceId"]) is False
    assert len(reads) == 1

    # another replica's record (or this one's before a restart) is read
    fresh = DirectRecords(db=db)
    assert await fresh.is_direct(instance_id=kept.accepted["instanceId"]) is True
    assert len(reads) == 2
