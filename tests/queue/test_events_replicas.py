"""The event stream on PostgreSQL replicas: cursor order is commit order (a transaction takes its
cursor only after every earlier taker committed, so a follower that read a cursor can never find
a smaller one committed later), and a follower on one replica gets, woken by the database's
notifications, every change made on either replica exactly once and in order."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psycopg

from nymph.client import QueueClient
from nymph.client.events import events_page, follow_events
from nymph.protocol import EventJSON
from nymph.queue.sql import events
from nymph.queue.sql.dialect import PgConn, pg_row_factory
from tests.support.pg_server import PgServer
from tests.support.queue_helpers import FAST, add_kind, open_queue

NS = "/v1/namespaces/default"


def test_a_later_cursor_is_never_visible_before_an_earlier_one_commits(pg_server: PgServer) -> None:
    from nymph.queue.pgdb import connect_and_migrate

    db = pg_server.fresh_database()
    try:
        connect_and_migrate(db)
        with psycopg.connect(db, autocommit=True, row_factory=pg_row_factory) as setup:
            setup.execute(
                "INSERT INTO instances (instance_id, namespace, provider, kube_namespace, state, "
                "launched_at, updated_at, version, requester) "
                "VALUES ('lakeshore-00000001', 'default', 'kind', 'jobs', 'queued', 0, 0, 1, 't')"
            )
        first = psycopg.connect(db, autocommit=True, row_factory=pg_row_factory)
        second = psycopg.connect(db, autocommit=True, row_factory=pg_row_factory)
        reader = psycopg.connect(db, autocommit=True, row_factory=pg_row_factory)
        with first, second, reader:

            def change(what: str) -> Callable[[PgConn], tuple[None, frozenset[str]]]:
                # as the backend runs a write: its events get their cursors as its last statement
                return events.collecting(
                    lambda c: events.record(c, instance_id="lakeshore-00000001", changes=[what], at=1.0)
                )

            pf = PgConn(first)
            first.execute("BEGIN")
            change("state")(pf)
            # The cursors are given by the last statement, sent with the COMMIT; hold the counter
            # here as that statement does until its commit lands.
            first.execute("SELECT clock FROM event_marks WHERE id = 1 FOR UPDATE")
            done = threading.Event()

            def later() -> None:
                second.execute("BEGIN")
                pg = PgConn(second)
                change("node")(pg)
                pg.commit()
                done.set()

            t = threading.Thread(target=later, name="second-writer")
            t.start()
            # The second writer waits for the first's cursor to commit: nothing newer is visible.
            assert not done.wait(0.5)
            assert reader.execute("SELECT COUNT(*) FROM events").fetchone()[0] == 0
            pf.commit()
            t.join(10)
            assert done.is_set()
            rows = reader.execute("SELECT seq, changes FROM events ORDER BY seq").fetchall()
            assert [r["changes"] for r in rows] == ["state", "node"] and rows[0]["seq"] < rows[1]["seq"]
    finally:
        pg_server.drop_database(db)


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
