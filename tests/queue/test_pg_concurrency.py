"""Writes on PostgreSQL that do not wait for each other, and stay correct: the queue on a real
PostgreSQL server one network round trip away (a TCP proxy on loopback adding 1 ms each way,
:mod:`tests.support.latency_proxy`), with writes to different launches running at once and two
replicas claiming and launching at once under a namespace's quota."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import psycopg
import pytest

from nymph.client import DaemonIdentity, QueueClient
from nymph.protocol import TaskJSON
from nymph.queue.models import Role
from tests.support.latency_proxy import LatencyProxy, pg_url_through, running_proxy
from tests.support.pg_server import PgServer
from tests.support.queue_helpers import FAST, Queue, add_kind, open_queue

BURST = 16


@pytest.fixture
def proxied(pg_server: PgServer) -> Iterator[tuple[str, LatencyProxy]]:
    """A fresh database and the latency proxy in front of the server (both gone at the end)."""
    db = pg_server.fresh_database()
    socket = str(pg_server.socket_dir / f".s.PGSQL.{pg_server.port}")
    try:
        with running_proxy(target_unix=socket) as proxy:
            yield db, proxy
    finally:
        pg_server.drop_database(db)


@asynccontextmanager
async def replicas(tmp_path: Path, url: str, count: int) -> AsyncIterator[list[Queue]]:
    """``count`` queues on one database (the first one's tokens valid on all)."""
    opened = [await open_queue(tmp_path, FAST, db=url) for _ in range(count)]
    try:
        first = opened[0][0]
        for q, _ in opened[1:]:
            q.user_token, q.daemon_token, q.admin_token = (
                first.user_token,
                first.daemon_token,
                first.admin_token,
            )
        yield [q for q, _ in opened]
    finally:
        for q, runner in opened:
            await q.close()
            await runner.cleanup()


@contextmanager
def writers_seen(direct_url: str) -> Iterator[list[int]]:
    """Sample, as fast as it goes on the server's own socket, how many of the queue's
    transactions hold written rows at once (``backend_xid`` is set by a transaction's first
    write); the list's one item is the most seen, once the block ends."""
    most = [0]
    stop = threading.Event()

    def sample() -> None:
        with psycopg.connect(direct_url, autocommit=True) as conn:
            while not stop.is_set():
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'nymph-queue' "
                    "AND datname = current_database() AND backend_xid IS NOT NULL"
                ).fetchone()
                most[0] = max(most[0], int(row[0]) if row else 0)

    thread = threading.Thread(target=sample, name="pg-writers-sampler", daemon=True)
    thread.start()
    try:
        yield most
    finally:
        stop.set()
        thread.join(10)


async def _launch(q: Queue, ns: str = "default") -> str:
    got = await q.user(ns).launch(provider="kind", mode="small", script="true")
    return got["instanceId"]


async def test_launches_of_different_instances_are_written_at_once(
    proxied: tuple[str, LatencyProxy], tmp_path: Path
) -> None:
    """16 launch POSTs sent at once are written at once: several of the queue's transactions
    hold written rows at the same moment, and the 16 at once take well under half the time of
    the same 16 one after another (each transaction waits for its round trips, not for the
    others), measured in one run."""
    db, proxy = proxied
    async with replicas(tmp_path, pg_url_through(db, proxy.port), 1) as [q]:
        await add_kind(q)
        await asyncio.gather(*(_launch(q) for _ in range(BURST)))  # warm: connections, caches
        t0 = time.perf_counter()
        for _ in range(BURST):
            await _launch(q)
        serial = time.perf_counter() - t0
        with writers_seen(db) as most:
            t0 = time.perf_counter()
            ids = await asyncio.gather(*(_launch(q) for _ in range(BURST)))
            burst = time.perf_counter() - t0
        assert len(set(ids)) == BURST
        assert most[0] >= 2, f"never more than {most[0]} write transaction at once"
        assert burst * 2 < serial, f"16 at once took {burst:.3f}s, one after another {serial:.3f}s"
        listed = await q.user().list_instances(provider="kind")
        assert len(listed) == 3 * BURST


async def test_quotas_hold_with_two_replicas_claiming_and_launching_at_once(
    proxied: tuple[str, LatencyProxy], tmp_path: Path
) -> None:
    """Two replicas on a database 1 ms away: while launches of two teams are POSTed through
    both, 12 daemons claim through both at once (no node offer). Team a's maxRunning (3) is
    never passed, every launch of team b is handed out, and no task is handed out twice."""
    db, proxy = proxied
    async with replicas(tmp_path, pg_url_through(db, proxy.port), 2) as qs:
        for team in ("team-a", "team-b"):
            await add_kind(qs[0], namespace=team, kube_ns="jobs")
        admin = await qs[0].token(Role.ADMIN, name="ops")
        r = await qs[0].call("PUT", "/v1/namespaces/team-a/quota", token=admin, json_body={"maxRunning": 3})
        assert r.status == 200, r.body
        handed: list[TaskJSON] = []
        posted = asyncio.Event()

        async def post(k: int) -> None:
            await _launch(qs[k % 2], "team-a")
            await _launch(qs[(k + 1) % 2], "team-b")

        async def daemon(k: int) -> None:
            d = qs[k % 2].daemon()
            d.daemon = DaemonIdentity(daemon_id=f"d{k}", node=f"n{k}", namespaces=("jobs",))
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                done = posted.is_set()
                handed.extend(
                    await d.claim(daemon_id=f"d{k}", node=f"n{k}", namespaces=["jobs"], capacity=2, wait=0)
                )
                if done:  # one more claim after every launch was in: then stop
                    return

        async def posts() -> None:
            await asyncio.gather(*(post(k) for k in range(12)))
            posted.set()

        await asyncio.gather(posts(), *(daemon(k) for k in range(12)))
        # what is left is for the claims after (a's quota is full; b's launches all went)
        for q in qs:
            handed.extend(
                await q.daemon().claim(
                    daemon_id="late", node="n-late", namespaces=["jobs"], capacity=20, wait=0
                )
            )
    times = Counter(t["taskId"] for t in handed)
    assert max(times.values()) == 1
    by_team = Counter(t["namespace"] for t in handed)
    assert by_team == {"team-a": 3, "team-b": 12}


async def test_one_idempotency_key_sent_at_once_to_two_replicas_makes_one_launch(
    proxied: tuple[str, LatencyProxy], tmp_path: Path
) -> None:
    """The same launch with one Idempotency-Key, sent 8 times at once through two replicas:
    every answer names the same instance, and only one was made."""
    db, proxy = proxied
    async with replicas(tmp_path, pg_url_through(db, proxy.port), 2) as qs:
        await add_kind(qs[0])
        answers = await asyncio.gather(
            *(
                qs[k % 2].user().launch(provider="kind", mode="small", script="true", idempotency_key="once")
                for k in range(8)
            )
        )
        assert len({a["instanceId"] for a in answers}) == 1
        assert len(await qs[1].user().list_instances(provider="kind")) == 1


async def test_one_report_stream_sent_at_once_to_two_replicas_applies_each_seq_once(
    proxied: tuple[str, LatencyProxy], tmp_path: Path
) -> None:
    """A daemon's outbox replaying one stream through two replicas at once (the same 6 reports
    twice, three batches each): each seq counts once, so the reports are applied once and in
    order, and the instance ends where the last one puts it."""
    db, proxy = proxied
    async with replicas(tmp_path, pg_url_through(db, proxy.port), 2) as qs:
        await add_kind(qs[0])
        iid = await _launch(qs[0])
        ds = [q.daemon() for q in qs]
        for d in ds:
            d.daemon = DaemonIdentity(daemon_id="d1", node="n1", namespaces=("jobs",))
        [task] = await ds[0].claim(daemon_id="d1", node="n1", namespaces=["jobs"], capacity=1, wait=0)
        states = ["starting", "starting", "running", "running", "running", "stopped"]
        reports = [{"seq": s, "instanceId": iid, "state": st, "node": "n1"} for s, st in enumerate(states, 1)]

        async def replay(d: QueueClient) -> int:
            acks = [await d.report(daemon_id="d1", stream="s", reports=reports[i : i + 2]) for i in (0, 2, 4)]
            return sum(a["accepted"] for a in acks)

        accepted = await asyncio.gather(*(replay(d) for d in ds))
        assert sum(accepted) == len(reports)
        got = await qs[1].user().get_instance(provider="kind", instance_id=iid)
        assert got["state"] == "stopped"
        assert [h["state"] for h in got["history"]] == ["queued", "starting", "running", "stopped"]
        assert task["instanceId"] == iid
