"""The sweep's waiting reasons for many queued launches at once: each launch gets its reason and
one event when the kind of its reason changes, as for one launch, and on PostgreSQL a network
round trip away the sweep costs as many round trips for forty newly waiting launches as for
three."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from nymph.launch.placement import Needs
from nymph.queue.pgdb import PgDatabase
from nymph.queue.sql import placement
from tests.support.latency_proxy import LatencyProxy, pg_url_through
from tests.support.queue_helpers import NO_SWEEPER, Queue, add_kind, open_queue

NS = "/v1/namespaces/default"
NO_DAEMON = "no live daemon serves this kube namespace"
CPU_NODE = {
    "name": "cpu-node",
    "labels": {"pool": "cpu"},
    "taints": [],
    "allocatable": {"cpu": "2", "memory": "4Gi"},
}


async def _launch(q: Queue, fields: dict[str, Any] | None = None) -> str:
    body = {"mode": "small", "script": "1", **({"fields": fields} if fields else {})}
    r = await q.call("POST", f"{NS}/providers/kind/launch", json_body=body)
    assert r.status == 202, r.body
    return str(r.body["instanceId"])


async def _events(q: Queue) -> list[dict[str, Any]]:
    """Every event of the namespace so far, in cursor order."""
    out: list[dict[str, Any]] = []
    cursor = ""
    while True:
        r = await q.call("GET", f"{NS}/events?limit=500{cursor}")
        assert r.status == 200, r.body
        out += r.body["items"]
        if not r.body["items"]:
            return out
        cursor = f"&after={r.body['items'][-1]['cursor']}"


async def _waiting_of(q: Queue) -> dict[str, str | None]:
    """Each instance's stored waiting reason (the API adds a standing worked out when read)."""
    rows = await q.store.db.read(
        lambda conn: conn.execute("SELECT instance_id, waiting FROM instances").fetchall()
    )
    return {r["instance_id"]: r["waiting"] for r in rows}


async def test_many_launches_get_their_reasons_and_one_event_each_per_kind(kind: Queue) -> None:
    """Thirty launches queued while no daemon is live: a sweep gives each the reason and one
    ``waiting`` event, in the order they were queued; sweeping again adds nothing. Once a daemon
    that sends no offer is live, each reason is cleared with one more event, the launch it
    claimed included."""
    ids = [await _launch(kind) for _ in range(30)]
    await kind.store.sweep()
    await kind.store.sweep()
    assert await _waiting_of(kind) == dict.fromkeys(ids, NO_DAEMON)
    told = [e for e in await _events(kind) if e["changes"] == ["waiting"]]
    assert [e["instanceId"] for e in told] == ids
    assert {(e["waiting"], e["waitingKind"], e["state"]) for e in told} == {(NO_DAEMON, "NoDaemon", "queued")}

    [claimed] = await kind.daemon().claim(daemon_id="d1", node="n1", capacity=1, wait=0)
    assert claimed["instanceId"] == ids[0]
    await kind.store.sweep()
    await kind.store.sweep()
    assert await _waiting_of(kind) == dict.fromkeys(ids, None)
    events = await _events(kind)
    per_instance = Counter(e["instanceId"] for e in events if e["changes"] == ["waiting"])
    assert per_instance == dict.fromkeys(ids, 2)
    last = {e["instanceId"]: e for e in events if e["changes"] == ["waiting"]}
    assert {(e["waiting"], e["waitingKind"]) for e in last.values()} == {(None, None)}, last


async def test_a_sweep_costs_as_many_round_trips_for_forty_newly_waiting_launches_as_for_three(
    proxied: tuple[str, LatencyProxy], tmp_path: Path
) -> None:
    """On PostgreSQL 1 ms away (a proxy that counts round trips, which only the sweep's own
    connections go through), giving forty launches their first reason takes the same round trips
    as giving three theirs: the reasons, the events and the kinds told are written together, not
    a few statements per launch waited for in turn (hundreds of launches newly waiting held a
    sweep, and its locks, for seconds)."""
    db, proxy = proxied
    q, runner = await open_queue(tmp_path, NO_SWEEPER, db=db)
    sweeper = PgDatabase(url=pg_url_through(db, proxy.port), pool_size=1)
    await sweeper.open()
    try:
        await add_kind(q)
        trips: list[int] = []
        ids: list[str] = []
        for n in (3, 40):
            ids += await asyncio.gather(*(_launch(q) for _ in range(n)))
            before = proxy.round_trips
            await sweeper.write(lambda conn: placement.update_waiting(conn, now=time.time()))
            trips.append(proxy.round_trips - before)
        assert trips[0] == trips[1], trips
        assert await _waiting_of(q) == dict.fromkeys(ids, NO_DAEMON)
        told = Counter(e["instanceId"] for e in await _events(q) if e["changes"] == ["waiting"])
        assert told == dict.fromkeys(ids, 1)
    finally:
        await sweeper.close()
        await q.close()
        await runner.cleanup()


async def test_launches_with_the_same_needs_are_judged_once_per_sweep(
    no_sweeper: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep checks each launch against every live daemon's offer: with a thousand daemons and
    hundreds of launches that is hundreds of thousands of checks. The offers do not change during
    a sweep, so launches of one kube namespace with equal needs share one judgement: twelve
    launches of two kinds of needs cost two, and each still gets the reason its own needs give."""
    judged: list[Needs] = []
    real = placement.why_waiting  # type: ignore[attr-defined]

    def counted(needs: Needs, offers: Any) -> str | None:
        judged.append(needs)
        return real(needs, offers)

    await no_sweeper.daemon().claim(daemon_id="d1", node="cpu-node", capacity=1, wait=0, node_info=CPU_NODE)
    big = {"resources": {"requests": {"cpu": "64"}}}
    picky = {"node_selector": {"gpu": "h100"}}
    bigs = [await _launch(no_sweeper, big) for _ in range(6)]
    pickies = [await _launch(no_sweeper, picky) for _ in range(6)]
    monkeypatch.setattr(placement, "why_waiting", counted)  # as the sweep calls it
    await no_sweeper.store.sweep()
    assert len(judged) == 2, judged
    waiting = await _waiting_of(no_sweeper)
    assert {waiting[i] for i in bigs} == {
        "no daemon's node has the allocatable resources for requests cpu=64"
    }
    assert {waiting[i] for i in pickies} == {"no daemon's node matches node_selector gpu=h100"}
