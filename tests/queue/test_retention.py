"""The expiry of stopped instances, on both backends: one stopped longer ago than the retention
is gone after the sweeper's pass, with every row that hung off it, and its GET is a 404 saying it
expired (not the 404 of an id that never existed); a recently stopped or a running one stays and
nothing else is touched; passes are bounded; tombstones go in their turn."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from nymph.protocol import now
from nymph.queue.expiry import InstanceExpiry
from nymph.queue.models import OutputSettings
from nymph.queue.sql.expiry import DUE, OWNED_TABLES
from tests.support.dispatch_helpers import apply
from tests.support.queue_helpers import FAST, Queue, add_kind, open_queue

NS = "/v1/namespaces/default"
INSTANCES = NS + "/providers/kind/instances"
HOUR = 3600.0


@pytest.fixture
async def q(tmp_path: Path, queue_db: Path | str) -> AsyncIterator[Queue]:
    """A queue keeping stopped instances an hour, sweeping expired ones on every sweep, two per
    transaction and three transactions per pass."""
    output = OutputSettings(retention_seconds=HOUR, purge_interval=0.0, expire_batch=2, expire_batches=3)
    queue, runner = await open_queue(tmp_path, dataclasses.replace(FAST, output=output), db=queue_db)
    await add_kind(queue)
    try:
        yield queue
    finally:
        await queue.close()
        await runner.cleanup()


async def _launch(q: Queue) -> str:
    r = await q.call("POST", NS + "/providers/kind/launch", json_body={"mode": "small", "script": "print(1)"})
    assert r.status == 202, r.body
    return str(r.body["instanceId"])


async def _age(q: Queue, iid: str, *, seconds: float) -> None:
    """Make ``iid`` look as if it last changed ``seconds`` ago."""
    at = now() - seconds
    await q.store.db.write(
        lambda c: c.execute("UPDATE instances SET updated_at = ? WHERE instance_id = ?", (at, iid))
    )


async def _rows(q: Queue, iid: str) -> dict[str, int]:
    def count(c: Any) -> dict[str, int]:
        out = {}
        for table in (*OWNED_TABLES, "instances"):
            out[table] = int(
                c.execute(f"SELECT COUNT(*) FROM {table} WHERE instance_id = ?", (iid,)).fetchone()[0]
            )
        return out

    return await q.store.db.read(count)


async def _stopped_with_output(q: Queue) -> str:
    """A launch applied by daemon d1, that logged a line and stopped."""
    iid = await _launch(q)
    d = q.daemon()
    assert await apply(d, daemon_id="d1", node="") == [iid]
    await d.ship_log_chunk(daemon_id="d1", instance_id=iid, offset=0, data=b"hello\n")
    report = {"seq": 1, "instanceId": iid, "state": "stopped", "reason": "Completed", "node": "n1"}
    await d.report(daemon_id="d1", stream=f"s-{iid}", reports=[report])
    return iid


async def test_an_old_stopped_instance_expires_and_says_so(q: Queue) -> None:
    q.store.expiry.clock = lambda: 0.0  # the sweeper expires nothing until the test is ready
    old = await _stopped_with_output(q)
    recent = await _stopped_with_output(q)
    running = await _launch(q)
    assert await apply(q.daemon(), daemon_id="d1", node="") == [running]
    await _age(q, old, seconds=2 * HOUR)
    await _age(q, running, seconds=2 * HOUR)  # long-running, not stopped: stays
    before = {i: await _rows(q, i) for i in (old, recent, running)}
    assert before[old]["log_chunks"] and before[old]["tasks"] and before[old]["instance_events"]

    q.store.expiry.clock = now
    await q.store.sweep()

    assert set((await _rows(q, old)).values()) == {0}, await _rows(q, old)
    assert await _rows(q, recent) == before[recent]
    assert await _rows(q, running) == before[running]
    r = await q.call("GET", f"{INSTANCES}/{old}")
    assert r.status == 404 and r.body["error"] == "instance_expired", r.body
    assert "expired" in r.body["detail"] and "--retention-days" in r.body["detail"]
    never = await q.call("GET", f"{INSTANCES}/lakeshore-0badc0de")
    assert never.status == 404 and never.body["error"] == "instance_not_found"
    logs = await q.call("GET", f"{INSTANCES}/{old}/logs")
    assert logs.status == 404 and logs.body["error"] == "instance_expired"
    listed = [i["instanceId"] for i in await q.user().list_instances(provider="kind")]
    assert listed == [recent, running]
    assert await q.user().get_logs(provider="kind", instance_id=recent) == "hello\n"
    # the catalog is untouched
    assert [p["name"] for p in await q.user().list_providers()] == ["kind"]
    assert [m["name"] for m in await q.user().list_modes()] == ["small"]


async def test_passes_are_bounded_and_tombstones_go_later(q: Queue) -> None:
    # the queue's own sweeper, whose clock now says 1970, expires nothing behind the test's back
    q.store.expiry.clock = lambda: 0.0
    expiry = InstanceExpiry(db=q.store.db, settings=q.store.expiry.settings)
    ids = [await _launch(q) for _ in range(8)]
    for iid in ids:
        await q.user().stop(provider="kind", instance_id=iid)  # never applied: stopped at once
        await _age(q, iid, seconds=2 * HOUR)
    first = await expiry.run(at=now())
    assert (first.instances, first.more) == (6, True)  # 3 transactions of 2
    second = await expiry.run(at=now())
    assert (second.instances, second.more) == (2, False)
    assert await q.user().list_instances(provider="kind") == []
    # a tombstone outlives the instance by tombstone_seconds (30 days), then goes, a batch a pass
    assert (await expiry.run(at=now() + 60)).tombstones == 0
    later = now() + expiry.settings.tombstone_seconds + 60
    assert (await expiry.run(at=later)).tombstones == 2
    codes = [(await q.call("GET", f"{INSTANCES}/{iid}")).body["error"] for iid in ids]
    assert sorted(codes) == ["instance_expired"] * 6 + ["instance_not_found"] * 2
    for _ in range(3):
        await expiry.run(at=later)
    for iid in ids:
        r = await q.call("GET", f"{INSTANCES}/{iid}")
        assert r.status == 404 and r.body["error"] == "instance_not_found"


async def test_the_sweeper_runs_expiry_through_its_clock(q: Queue) -> None:
    iid = await _launch(q)
    await q.user().stop(provider="kind", instance_id=iid)
    await q.store.sweep()
    assert (await q.call("GET", f"{INSTANCES}/{iid}")).status == 200  # stopped just now: kept
    q.store.expiry.clock = lambda: now() + 2 * HOUR
    await q.store.sweep()
    r = await q.call("GET", f"{INSTANCES}/{iid}")
    assert r.status == 404 and r.body["error"] == "instance_expired"


@pytest.mark.sqlite_only
async def test_a_pass_reads_an_index_range_and_deletes_by_index(q: Queue, backend: str) -> None:
    def plans(c: Any) -> list[str]:
        out = [" ".join(str(r[-1]) for r in c.execute("EXPLAIN QUERY PLAN " + DUE, (1.0, 10)))]
        for table in (*OWNED_TABLES, "instances"):
            sql = f"EXPLAIN QUERY PLAN DELETE FROM {table} WHERE instance_id IN (?, ?)"
            out.append(" ".join(str(r[-1]) for r in c.execute(sql, ("a", "b"))))
        # deleting a task looks up the tasks that wait on it (a foreign key): by index too
        out.append(
            " ".join(
                str(r[-1])
                for r in c.execute("EXPLAIN QUERY PLAN SELECT 1 FROM tasks WHERE after_task = ?", ("t",))
            )
        )
        return out

    due, *deletes = await q.store.db.read(plans)
    assert "USING INDEX instances_by_state_age" in due and "TEMP B-TREE" not in due, due
    for plan in deletes:
        assert "SEARCH" in plan and "SCAN" not in plan, plan
