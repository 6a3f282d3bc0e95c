"""Writes on PostgreSQL that do not wait for each other, and stay correct: the queue on a real
PostgreSQL server one network round trip away (a TCP proxy on loopback adding 1 ms each way,
:mod:`tests.support.latency_proxy`), with writes to different launches running at once and two
replicas claiming and launching at once under a namespace's quota."""

from __future__ import annotations

import asyncio
import gc
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from nymph.client import DaemonIdentity, QueueClient
from nymph.protocol import TaskJSON
from nymph.queue.models import Role
from nymph.queue.pgdb import PgDatabase
from nymph.queue.sql import launches
from nymph.queue.sql.dialect import Conn, send
from tests.support.latency_proxy import LatencyProxy, pg_url_through, running_proxy
from tests.support.pg_server import PgServer, running_server
from tests.support.queue_helpers import FAST, Queue, add_kind, open_queue

BURST = 16


@pytest.fixture
def far_proxied(pg_server: PgServer) -> Iterator[tuple[str, LatencyProxy]]:
    """Like ``proxied``, 5 ms each way: a launch then waits mostly for its round trips, so what
    16 at once take shows whether they wait for each other, not this machine's CPU."""
    db = pg_server.fresh_database()
    socket = str(pg_server.socket_dir / f".s.PGSQL.{pg_server.port}")
    try:
        with running_proxy(target_unix=socket, delay=0.005) as proxy:
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


async def _launch(q: Queue, ns: str = "default", *, key: str | None = None) -> str:
    got = await q.user(ns).launch(provider="kind", mode="small", script="true", idempotency_key=key)
    return got["instanceId"]


async def test_launches_of_different_instances_are_written_at_once(
    far_proxied: tuple[str, LatencyProxy], tmp_path: Path
) -> None:
    """16 launch POSTs sent at once are written at once: several of their round trips to the
    database are under way at the same moment, and the 16 at once take well under half the time
    of the same 16 one after another (each write waits for its round trips, not for the
    others), measured in one run. Each is sent with an Idempotency-Key, so each is a write of
    its own (launches without one that arrive together are written together)."""
    db, proxy = far_proxied
    keys = (f"k{n}" for n in range(4 * BURST))
    async with replicas(tmp_path, pg_url_through(db, proxy.port), 1) as [q]:
        await add_kind(q)
        await asyncio.gather(*(_launch(q, key=next(keys)) for _ in range(BURST)))  # warm: connections, caches
        # No collection of this long-lived test process's heap inside what is timed (one took
        # half a second once, late in a full run).
        gc.collect()
        gc.disable()
        try:
            t0 = time.perf_counter()
            for _ in range(BURST):
                await _launch(q, key=next(keys))
            serial = time.perf_counter() - t0
            proxy.most_in_flight = proxy.in_flight
            t0 = time.perf_counter()
            ids = await asyncio.gather(*(_launch(q, key=next(keys)) for _ in range(BURST)))
            burst = time.perf_counter() - t0
        finally:
            gc.enable()
        assert len(set(ids)) == BURST
        assert proxy.most_in_flight >= 4, f"never more than {proxy.most_in_flight} round trips at once"
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


async def _round_trips(proxy: LatencyProxy, call: Awaitable[object]) -> int:
    before = proxy.round_trips
    await call
    await asyncio.sleep(0.05)  # every answer delivered (the proxy's 1 ms each way)
    return proxy.round_trips - before


async def test_a_transaction_costs_one_round_trip_more_than_its_statements_and_a_lone_read_one(
    proxied: tuple[str, LatencyProxy],
) -> None:
    """On a database one round trip away, a transaction's BEGIN travels with its first
    statement (a one-statement write or read: two round trips, its statement and the COMMIT),
    and a one-statement read (a token, a session, a provider) is sent alone: one."""
    db, proxy = proxied
    pg = PgDatabase(url=pg_url_through(db, proxy.port), pool_size=1)
    await pg.open()
    try:
        await pg.write(lambda c: c.execute("CREATE TABLE rt (k INTEGER PRIMARY KEY, v TEXT)"))

        def one(c: Conn) -> object:
            return c.execute("SELECT v FROM rt WHERE k = ?", (1,)).fetchone()

        def two(c: Conn) -> object:
            c.execute("SELECT v FROM rt WHERE k = ?", (1,)).fetchone()
            return c.execute("SELECT count(*) FROM rt").fetchone()

        for _ in range(2):  # warm: the pool's connection is open
            await pg.read_one(one)
        assert await _round_trips(proxy, pg.write(lambda c: c.execute("INSERT INTO rt VALUES (1, 'x')"))) == 2
        assert await _round_trips(proxy, pg.read(one)) == 2
        assert await _round_trips(proxy, pg.read(two)) == 3
        assert await _round_trips(proxy, pg.read_one(one)) == 1
        assert await pg.read_one(one) == ("x",)
    finally:
        await pg.close()


async def test_a_one_statement_read_refuses_a_second_statement_and_any_write(
    proxied: tuple[str, LatencyProxy],
) -> None:
    """A one-statement read runs outside a transaction, so it takes no second statement (a
    second snapshot) and no write (it would commit at once): both are refused, nothing written."""
    db, _ = proxied
    pg = PgDatabase(url=db, pool_size=2)
    await pg.open()
    try:
        await pg.write(lambda c: c.execute("CREATE TABLE ro (k INTEGER PRIMARY KEY)"))

        def twice(c: Conn) -> object:
            c.execute("SELECT 1").fetchone()
            return c.execute("SELECT 2").fetchone()

        with pytest.raises(RuntimeError, match="second statement"):
            await pg.read_one(twice)
        with pytest.raises(RuntimeError, match="cannot write"):
            await pg.read_one(lambda c: send(c, "INSERT INTO ro VALUES (1)"))
        with pytest.raises(RuntimeError, match="cannot write"):
            await pg.read_one(lambda c: c.executemany("INSERT INTO ro VALUES (?)", [(1,), (2,)]))
        assert await pg.read(lambda c: c.execute("SELECT count(*) FROM ro").fetchone()[0]) == 0
    finally:
        await pg.close()


async def test_calls_after_a_database_restart_run_on_fresh_connections_at_once() -> None:
    """After the server restarted, the pool's connections are dead: the first read, write and
    one-statement read each notice before anything was committed and run again on a new
    connection (no error, nothing written twice)."""
    with running_server() as server:
        db = server.fresh_database()
        pg = PgDatabase(url=db, pool_size=3)
        await pg.open()
        try:
            await pg.write(lambda c: c.execute("CREATE TABLE rs (k INTEGER PRIMARY KEY)"))

            def count(c: Conn) -> int:
                return int(c.execute("SELECT count(*) FROM rs").fetchone()[0])

            # three connections in the pool, all of which the restart will kill
            await asyncio.gather(
                *(pg.read(lambda c: c.execute("SELECT pg_sleep(0.2)").fetchone()) for _ in range(3))
            )
            await asyncio.to_thread(server.stop)
            await asyncio.to_thread(server.start)
            await pg.write(lambda c: c.execute("INSERT INTO rs VALUES (1)"))
            assert await pg.read(count) == 1
            assert await pg.read_one(count) == 1
        finally:
            await pg.close()


async def test_a_launch_is_written_in_two_round_trips(
    proxied: tuple[str, LatencyProxy], tmp_path: Path
) -> None:
    """A launch's write on a database one round trip away: its provider, mode and quota read
    together, then the instance, its events and its task as one statement (a taken id fails
    it, and the write runs again), and no round trip after it (its event gets its cursor when
    first read); and the launch is there, queued, with its task."""
    db, proxy = proxied
    q, runner = await open_queue(tmp_path, FAST, db=db)
    try:
        await add_kind(q)
    finally:
        await q.close()
        await runner.cleanup()
    pg = PgDatabase(url=pg_url_through(db, proxy.port), pool_size=1)
    await pg.open()
    try:

        def launch(conn: Conn) -> str:
            accepted, spec = launches.launch(
                conn,
                ns="default",
                provider_name="kind",
                body={"mode": "small", "script": "print(1)"},
                idempotency_key=None,
                requester="tester",
            )
            assert spec is not None
            return accepted["instanceId"]

        await pg.write(launch)  # warm: the pool's connection is open
        before = proxy.round_trips
        instance_id = await pg.write(launch)
        await asyncio.sleep(0.05)
        assert proxy.round_trips - before == 2  # and nothing more: its event is sealed when read

        def written(conn: Conn) -> tuple[object, ...]:
            row = conn.execute(
                "SELECT i.state, t.kind, t.status FROM instances i JOIN tasks t USING (instance_id) "
                "WHERE i.instance_id = ?",
                (instance_id,),
            ).fetchone()
            return tuple(row)

        assert await pg.read(written) == ("queued", "launch", "pending")
    finally:
        await pg.close()
