"""The event stream on PostgreSQL replicas: writes never wait for each other, and a cursor is
given after its event committed (so a follower that read a cursor can never find a smaller one
committed later), and a follower on one replica gets, woken by the database's
notifications, every change made on either replica exactly once and in order."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg

from nymph.client import QueueClient
from nymph.client.events import events_page, follow_events
from nymph.protocol import EventJSON, now
from nymph.queue.errors import Unavailable
from nymph.queue.pgdb import PgDatabase
from nymph.queue.sql import events
from nymph.queue.sql.dialect import PgConn, pg_row_factory
from tests.support.latency_proxy import LatencyProxy, pg_url_through
from tests.support.pg_server import PgServer
from tests.support.queue_helpers import FAST, add_kind, open_queue

NS = "/v1/namespaces/default"


def _instances(db: str, *ids: str) -> None:
    with psycopg.connect(db, autocommit=True, row_factory=pg_row_factory) as setup:
        for iid in ids:
            setup.execute(
                "INSERT INTO instances (instance_id, namespace, provider, kube_namespace, state, "
                "launched_at, updated_at, version, requester) "
                "VALUES (%s, 'default', 'kind', 'jobs', 'queued', 0, 0, 1, 't')",
                (iid,),
            )


@contextlib.contextmanager
def _stream_db(pg_server: PgServer) -> Iterator[tuple[psycopg.Connection[Any], ...]]:
    """A fresh migrated database with two queued instances, and three connections to it."""
    from nymph.queue.pgdb import connect_and_migrate

    db = pg_server.fresh_database()
    try:
        connect_and_migrate(db)
        _instances(db, "lakeshore-00000001", "lakeshore-00000002")
        conns = tuple(psycopg.connect(db, autocommit=True, row_factory=pg_row_factory) for _ in range(3))
        try:
            yield conns
        finally:
            for conn in conns:
                conn.close()
    finally:
        pg_server.drop_database(db)


def _change(iid: str, what: str) -> Callable[[PgConn], tuple[None, frozenset[str]]]:
    # as the backend runs a write
    return events.collecting(lambda c: events.record(c, instance_id=iid, changes=[what], at=1.0))


def _stream(reader: psycopg.Connection[Any]) -> list[tuple[object, str]]:
    rows = reader.execute("SELECT seq, changes FROM events ORDER BY id").fetchall()
    return [(r["seq"], r["changes"]) for r in rows]


def test_writes_never_wait_for_each_other_and_a_later_cursor_is_never_visible_first(
    pg_server: PgServer,
) -> None:
    """Two write transactions adding events run at once: the second commits while the first is
    still open (nothing they share is locked). Cursors come after the commit, from a sealing
    statement: the second's event gets one and is read; the first's, committed later, gets a
    larger one, so a follower that read the second's never misses the first's."""
    with _stream_db(pg_server) as (first, second, reader):
        pf = PgConn(first)
        first.execute("BEGIN")
        _change("lakeshore-00000001", "state")(pf)
        pf.flush()  # its event is inserted; the transaction stays open
        done = threading.Event()

        def later() -> None:
            second.execute("BEGIN")
            pg = PgConn(second)
            _change("lakeshore-00000002", "node")(pg)
            pg.commit()
            done.set()

        t = threading.Thread(target=later, name="second-writer")
        t.start()
        assert done.wait(10), "the second write waited for the first"
        t.join(10)
        assert _stream(reader) == [(None, "node")]  # committed, not sealed: not readable yet
        assert events.seal(PgConn(reader, single=True)) == frozenset({"default"})
        [(node_seq, _)] = _stream(reader)
        assert isinstance(node_seq, int)
        pf.commit()
        assert events.seal(PgConn(reader, single=True)) == frozenset({"default"})
        state_seq = {c: q for q, c in _stream(reader)}["state"]
        assert isinstance(state_seq, int) and state_seq > node_seq
        assert events.seal(PgConn(reader, single=True)) == frozenset()  # nothing left


def test_two_sealing_statements_at_once_never_give_a_cursor_twice(pg_server: PgServer) -> None:
    """A sealing statement that waits for another's commit leaves alone what that one sealed
    meanwhile, and gives what is still unsealed cursors above that one's: no event gets two
    cursors, no cursor goes to two events, and the later statement's are the larger."""
    with _stream_db(pg_server) as (holder, other, writer):
        for what in ("state", "reason"):
            w = PgConn(writer)
            writer.execute("BEGIN")
            _change("lakeshore-00000001", what)(w)
            w.commit()
        holder.execute("BEGIN")
        assert events.seal(PgConn(holder)) == frozenset({"default"})  # holds the counter
        first_given = {c: q for q, c in _stream(holder)}
        w = PgConn(writer)
        writer.execute("BEGIN")
        _change("lakeshore-00000002", "node")(w)
        w.commit()
        sealed: list[frozenset[str]] = []
        t = threading.Thread(target=lambda: sealed.append(events.seal(PgConn(other, single=True))))
        t.start()
        t.join(0.5)
        assert t.is_alive(), "the second sealing statement did not wait for the first"
        holder.execute("COMMIT")
        t.join(10)
        assert sealed == [frozenset({"default"})]
        rows = {c: q for q, c in _stream(writer)}
        seqs = list(rows.values())
        assert all(isinstance(q, int) for q in seqs) and len(set(seqs)) == 3
        # what the first gave stands (a follower may have read it): not given again
        assert {c: rows[c] for c in ("state", "reason")} == first_given
        assert rows["node"] > max(rows["state"], rows["reason"])  # type: ignore[operator]
        assert rows["state"] < rows["reason"]  # type: ignore[operator]


async def test_a_follower_on_one_replica_gets_every_change_made_on_both(
    pg_server: PgServer, tmp_path: Path
) -> None:
    db = pg_server.fresh_database()
    (a, ra), (b, rb) = [await open_queue(tmp_path, FAST, db=db) for _ in range(2)]
    try:
        b.user_token = a.user_token  # one database: every replica knows every token
        await add_kind(a)
        got: list[EventJSON] = []
        arrived = asyncio.Event()

        def on_event(e: EventJSON) -> None:
            got.append(e)
            arrived.set()

        async with (
            QueueClient(base_url=a.url, token=a.user_token) as here,
            QueueClient(base_url=b.url, token=a.user_token) as there,
        ):
            follower = asyncio.create_task(follow_events(here, on_event=on_event))
            await asyncio.sleep(0.3)
            t0 = time.monotonic()
            first = await there.launch(provider="kind", mode="small", script="print(0)")
            await asyncio.wait_for(arrived.wait(), 5)
            assert got[0]["instanceId"] == first["instanceId"]
            assert time.monotonic() - t0 < 2  # woken by the database's NOTIFY, not a timer

            async def writer(client: QueueClient, k: int) -> None:
                for i in range(15):
                    made = await client.launch(provider="kind", mode="small", script=f"print({k}, {i})")
                    if i % 3 == 0:
                        await client.stop(provider="kind", instance_id=made["instanceId"])

            await asyncio.gather(*(writer(here if k % 2 else there, k) for k in range(8)))
            stored: list[EventJSON] = []
            cursor: str | None = None
            while True:
                items, cursor = await events_page(there, after=cursor, limit=50)
                if not items:
                    break
                stored += items
            # every launch and stop (and, as no daemon serves the namespace, its waiting reasons)
            assert len([e for e in stored if e["changes"] != ["waiting"]]) == 1 + 8 * 15 + 8 * 5
            async with asyncio.timeout(10):
                while len(got) < len(stored):
                    arrived.clear()
                    await arrived.wait()
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)
        assert [e["cursor"] for e in got] == [e["cursor"] for e in stored]
    finally:
        for q, runner in ((a, ra), (b, rb)):
            await q.close()
            await runner.cleanup()
        pg_server.drop_database(db)


async def test_events_without_cursors_are_sealed_by_a_read_and_by_the_sweep(
    pg_server: PgServer, tmp_path: Path
) -> None:
    """Events committed without their cursors (here by a connection of the test's own, as a
    replica that died before it woke anyone) are not left behind: a page read seals them before
    it answers, and the sweep seals them with no read at all, waking the namespace's followers."""
    db = pg_server.fresh_database()
    q, runner = await open_queue(tmp_path, FAST, db=db)
    try:
        await add_kind(q)
        _instances(db, "lakeshore-00000001", "lakeshore-00000002")
        told: list[frozenset[str]] = []
        q.store.db.events_written = told.append

        def left_unsealed(iid: str, what: str) -> None:
            with psycopg.connect(db, autocommit=True, row_factory=pg_row_factory) as died:
                conn = PgConn(died)
                died.execute("BEGIN")
                events.record(conn, instance_id=iid, changes=[what], at=now())
                conn.commit()

        def seqs() -> list[object]:
            with psycopg.connect(db, autocommit=True) as reader:
                return [r[0] for r in reader.execute("SELECT seq FROM events ORDER BY id").fetchall()]

        async with QueueClient(base_url=q.url, token=q.user_token) as user:
            left_unsealed("lakeshore-00000001", "state")
            items, cursor = await events_page(user, limit=50)
            assert [(e["instanceId"], e["changes"]) for e in items] == [("lakeshore-00000001", ["state"])]
            assert items[0]["cursor"] == cursor and int(cursor) > 0
        left_unsealed("lakeshore-00000002", "node")
        assert seqs() == [int(cursor), None]
        told.clear()
        await q.store.sweep()
        assert seqs() == [int(cursor), int(cursor) + 1]
        assert told == [frozenset({"default"})]
    finally:
        await q.close()
        await runner.cleanup()
        pg_server.drop_database(db)


async def test_a_seal_that_cannot_reach_the_database_answers_every_caller(pg_server: PgServer) -> None:
    """Stream reads whose seal cannot reach the database are each told so (the 503 error), none
    waits for ever, and the events are left without cursors for a later seal."""
    db = pg_server.fresh_database()
    proxy = LatencyProxy(target_unix=str(pg_server.socket_dir / f".s.PGSQL.{pg_server.port}"), delay=0.0005)
    await proxy.start()
    pg = PgDatabase(url=pg_url_through(db, proxy.port), pool_size=2, timeout=2)
    try:
        await pg.open()
        await pg.write(
            lambda c: events.record_created(
                c, ns="team-a", provider="p", group=None, instance_ids=["lakeshore-0000000a"], at=1.0
            )
        )
        await proxy.close()
        got = await asyncio.wait_for(
            asyncio.gather(pg.seal_events(), pg.seal_events(), return_exceptions=True), 60
        )
        assert [type(g) for g in got] == [Unavailable, Unavailable], got
        with psycopg.connect(db, autocommit=True) as direct:
            assert direct.execute("SELECT seq FROM events").fetchall() == [(None,)]
            assert events.seal(PgConn(direct, single=True)) == frozenset({"team-a"})
    finally:
        await pg.close()
        await proxy.close()
        pg_server.drop_database(db)
