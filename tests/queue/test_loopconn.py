"""PostgreSQL transactions run on the event loop's own thread: the synchronous SQL in a greenlet
whose waits for the server are served by the loop (:mod:`nymph.queue.loopconn`), against a
real PostgreSQL server."""

from __future__ import annotations

import asyncio
import gc
import socket
import struct
import threading
from collections.abc import AsyncIterator, Callable

import psycopg
import pytest
from psycopg.abc import PQGen
from psycopg.waiting import READY_R, READY_W, WAIT_W

from nymph.queue import loopconn
from nymph.queue.loopconn import LoopConnection, NotOnLoop, await_only
from nymph.queue.pgdb import PgDatabase
from nymph.queue.sql import events
from nymph.queue.sql.dialect import Conn, PgConn
from tests.support.latency_proxy import LatencyProxy, pg_url_through
from tests.support.pg_server import PgServer

# --- the bridge alone ------------------------------------------------------------------------


async def test_a_bridged_function_gets_what_its_awaitables_give_and_raise() -> None:
    """A synchronous function run by ``Runner.run`` waits on the loop through ``await_only``: it gets
    each awaitable's result, an awaitable's exception is raised at its ``await_only`` (where the
    function can catch it), and the function's own result or exception reaches the caller."""

    async def fails() -> None:
        raise LookupError("from the loop")

    def body() -> tuple[int, str]:
        got = await_only(asyncio.sleep(0, result=21))
        try:
            await_only(fails())
        except LookupError as exc:
            caught = str(exc)
        return got * 2, caught

    assert await loopconn.Runner().run(body) == (42, "from the loop")

    def broken() -> None:
        await_only(asyncio.sleep(0))
        raise ValueError("from the function")

    with pytest.raises(ValueError, match="from the function"):
        await loopconn.Runner().run(broken)


async def test_a_wait_outside_a_bridged_function_is_refused() -> None:
    """``await_only`` outside ``Runner.run`` (a plain thread, or the loop's own code) is refused with
    NotOnLoop, never a hang."""

    async def never() -> None:
        raise AssertionError("not awaited")

    coro = never()
    try:
        with pytest.raises(NotOnLoop):
            await_only(coro)
    finally:
        coro.close()
    assert not loopconn.on_loop()
    assert await loopconn.Runner().run(loopconn.on_loop)


async def test_a_cancelled_caller_leaves_its_function_running_to_its_end() -> None:
    """A transaction once started ends as it would have (a thread did the same): cancelling the
    caller stops its wait, not the function."""
    done = asyncio.Event()

    def body() -> str:
        await_only(asyncio.sleep(0.05))
        done.set()
        return "ended"

    caller = asyncio.create_task(loopconn.Runner().run(body))
    await asyncio.sleep(0.01)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await asyncio.wait_for(done.wait(), 5)


async def test_the_error_of_a_function_whose_caller_was_cancelled_is_not_reported_as_lost() -> None:
    """A function that fails after its caller was cancelled (a client gone, a database gone) has
    nobody left to tell: asyncio must not log its error as "never retrieved"."""
    loop = asyncio.get_running_loop()
    reported: list[str] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(str(context.get("message"))))
    ended = asyncio.Event()

    def body() -> str:
        await_only(asyncio.sleep(0.05))
        ended.set()
        raise LookupError("the database went away")

    runner = loopconn.Runner()
    try:
        caller = asyncio.create_task(runner.run(body))
        await asyncio.sleep(0.01)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        await asyncio.wait_for(ended.wait(), 5)
        await runner.drain(timeout=5)
        del caller
        await asyncio.sleep(0)
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(None)
    assert not [m for m in reported if "never retrieved" in m], reported


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    """A connected TCP pair on loopback: (the client end, non-blocking, as a database
    connection's socket is; the server end)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
    client.setblocking(False)
    return client, server


def test_a_socket_reset_while_nobody_waits_still_ends_the_next_wait() -> None:
    """uvloop calls a reader once more when its socket fails (a reset: a database that went
    away behind a proxy) and then drops it for good. When that call comes between two waits of
    a transaction, the next wait must still end at once (the socket is readable: the read
    raises), not wait forever for a call that will never come."""
    uvloop = pytest.importorskip("uvloop")
    loop = uvloop.new_event_loop()
    client, server = _tcp_pair()
    try:

        async def scenario() -> int:
            held = loopconn._HeldReader(asyncio.get_running_loop(), client.fileno())
            try:
                # The peer resets the connection while no wait is under way.
                server.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                server.close()
                for _ in range(20):  # the loop sees the failure and calls the reader once
                    await asyncio.sleep(0.005)
                return await asyncio.wait_for(
                    loopconn.Runner().run(lambda: loopconn._held_read(client.fileno(), held)), 2
                )
            finally:
                held.close()

        assert loop.run_until_complete(scenario()) == READY_R
    finally:
        loop.close()
        client.close()
        server.close()


async def test_a_wait_whose_registration_the_loop_dropped_still_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wait for the server does not rely on the loop alone: when the loop has dropped the
    socket's registration without a word, the wait polls the socket itself after
    ``RECHECK`` seconds, registers it again, and ends once the answer is there."""
    monkeypatch.setattr(loopconn, "RECHECK", 0.2)
    loop = asyncio.get_running_loop()
    client, server = _tcp_pair()
    held = loopconn._HeldReader(loop, client.fileno())
    try:
        waiting = asyncio.create_task(
            loopconn.Runner().run(lambda: loopconn._held_read(client.fileno(), held))
        )
        await asyncio.sleep(0.05)
        loop.remove_reader(client.fileno())  # the loop forgets the socket
        await asyncio.sleep(0.3)
        assert not waiting.done(), "nothing to read yet: the wait goes on"
        server.sendall(b"x")  # the answer arrives, and the loop is not told
        assert await asyncio.wait_for(waiting, 2) == READY_R
    finally:
        held.close()
        client.close()
        server.close()


# --- on a real server --------------------------------------------------------------------------


@pytest.fixture
async def pg(pg_server: PgServer) -> AsyncIterator[PgDatabase]:
    db = pg_server.fresh_database()
    database = PgDatabase(url=db, pool_size=4)
    await database.open()
    try:
        yield database
    finally:
        await database.close()
        pg_server.drop_database(db)


async def test_transactions_run_on_the_loop_thread_and_overlap_their_waits(pg: PgDatabase) -> None:
    """Every transaction runs on the event loop's thread (no thread pool: no thread switch per
    wait), and while one waits for the server the loop serves the others: writes sent while a
    long read waits all end before it does."""
    loop_thread = threading.get_ident()
    await pg.write(lambda c: c.execute("CREATE TABLE meet (k INTEGER PRIMARY KEY)"))
    seen: set[int] = set()

    def insert(k: int) -> Callable[[Conn], int]:
        def run(c: Conn) -> int:
            seen.add(threading.get_ident())
            c.execute("INSERT INTO meet VALUES (?)", (k,))
            return k

        return run

    def slow(c: Conn) -> int:
        seen.add(threading.get_ident())
        return int(c.execute("SELECT count(*) FROM meet, pg_sleep(1.0)").fetchone()[0])

    sleeper = asyncio.create_task(pg.read_one(slow))
    await asyncio.sleep(0.05)
    assert sorted(await asyncio.gather(*(pg.write(insert(k)) for k in range(4)))) == [0, 1, 2, 3]
    assert not sleeper.done()
    assert await sleeper == 0  # its statement's snapshot was taken before the inserts
    assert seen == {loop_thread}


async def test_two_writes_at_once_each_tell_only_the_namespaces_they_wrote_events_to(
    pg: PgDatabase,
) -> None:
    """The namespaces a write added events to (which wake that namespace's followers) are kept
    per transaction, also when two run at once on the loop's thread and interleave their waits;
    sealed, their events' cursors follow the order they were inserted in."""
    told: list[frozenset[str]] = []
    pg.events_written = told.append

    def create(ns: str) -> object:
        def run(c: Conn) -> None:
            c.execute("SELECT pg_sleep(0.05)").fetchone()  # both are under way here
            events.record_created(
                c, ns=ns, provider="p", group=None, instance_ids=[f"lakeshore-{ns}"], at=1.0
            )
            c.execute("SELECT pg_sleep(0.05)").fetchone()

        return run

    await asyncio.gather(pg.write(create("team-a")), pg.write(create("team-b")))
    assert sorted(told, key=sorted) == [frozenset({"team-a"}), frozenset({"team-b"})]
    await pg.seal_events()
    assert len(told) == 2  # a seal without ``wake`` wakes no one
    seqs = await pg.read(lambda c: [r[0] for r in c.execute("SELECT seq FROM events ORDER BY id").fetchall()])
    assert seqs == [1, 2]


async def test_a_cancelled_write_still_commits_and_its_connection_stays_usable(pg: PgDatabase) -> None:
    """A caller cancelled mid-transaction (a client gone, a shutdown) does not leave half a
    transaction: it commits as it would have, and the pool's connections work afterwards."""
    await pg.write(lambda c: c.execute("CREATE TABLE kept (k INTEGER PRIMARY KEY)"))

    def slow(c: Conn) -> None:
        c.execute("SELECT pg_sleep(0.2)").fetchone()
        c.execute("INSERT INTO kept VALUES (1)")

    caller = asyncio.create_task(pg.write(slow))
    await asyncio.sleep(0.05)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    for _ in range(100):
        n = await pg.read(lambda c: int(c.execute("SELECT count(*) FROM kept").fetchone()[0]))
        if n:
            break
        await asyncio.sleep(0.02)
    assert n == 1
    assert (
        await asyncio.gather(*(pg.read_one(lambda c: c.execute("SELECT 7").fetchone()[0]) for _ in range(8)))
        == [7] * 8
    )


async def test_a_loop_connection_used_from_a_thread_is_refused_not_blocked(pg_server: PgServer) -> None:
    """The loop's connections wait only through the loop: used anywhere else they refuse at
    once (NotOnLoop) instead of blocking a thread or the loop."""
    aconn = await psycopg.AsyncConnection.connect(pg_server.url(), autocommit=True, prepare_threshold=None)
    try:
        twin = LoopConnection.twin(aconn, row_factory=psycopg.rows.tuple_row)
        with pytest.raises(NotOnLoop):
            await asyncio.to_thread(lambda: twin.execute("SELECT 1"))
    finally:
        await aconn.close()


async def test_a_transaction_goes_to_the_loop_once_per_round_trip(
    proxied: tuple[str, LatencyProxy], monkeypatch: pytest.MonkeyPatch
) -> None:
    """psycopg asks for a wait at every step of a statement; only the waits for the server's
    answer go to the loop: a transaction of many statements in three round trips (a read, an
    insert that begins the transaction, the statements sent with its COMMIT) waits on the loop
    three times, and what it wrote is there. Through a proxy 1 ms each way, so that no answer
    is already in when psycopg first asks (a local server's sometimes was: one wait fewer)."""
    db, proxy = proxied
    pg = PgDatabase(url=pg_url_through(db, proxy.port), pool_size=4)
    await pg.open()
    try:
        await _round_trips(pg, monkeypatch)
    finally:
        await pg.close()


async def _round_trips(pg: PgDatabase, monkeypatch: pytest.MonkeyPatch) -> None:
    await pg.write(lambda c: c.execute("CREATE TABLE trips (k INTEGER PRIMARY KEY, v TEXT)"))
    waits: list[int] = []
    real = loopconn._ready_later

    def counted(fileno: int, state: int, held: loopconn._HeldReader | None = None) -> int:
        waits.append(state)
        return real(fileno, state, held)

    monkeypatch.setattr(loopconn, "_ready_later", counted)

    def write(c: Conn) -> int:
        assert isinstance(c, PgConn)
        first = c.execute("SELECT count(*) FROM trips").fetchone()
        c.execute("INSERT INTO trips VALUES (?, ?)", (1, "one"))
        for k in range(2, 7):
            c.send("INSERT INTO trips VALUES (?, ?)", (k, str(k)))
        c.send("UPDATE trips SET v = v || '!' WHERE k = ?", (1,))
        return int(first[0])

    assert await pg.write(write) == 0
    assert len(waits) == 3, waits
    rows = await pg.read(
        lambda c: [tuple(r) for r in c.execute("SELECT k, v FROM trips ORDER BY k").fetchall()]
    )
    assert rows == [(1, "one!"), *((k, str(k)) for k in range(2, 7))]


async def test_a_transaction_keeps_one_reader_on_its_socket_and_leaves_none_behind(
    proxied: tuple[str, LatencyProxy], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every wait of one transaction for the server's answer goes through the same reader, kept
    on the socket from its first wait to the transaction's end; once the connection is back in
    the pool no reader of the transaction is left on the socket (the pool's own waits register
    theirs), and the next transactions on the same connections still get their answers."""
    db, proxy = proxied
    pg = PgDatabase(url=pg_url_through(db, proxy.port), pool_size=1)
    await pg.open()
    try:
        await pg.write(lambda c: c.execute("CREATE TABLE trips (k INTEGER PRIMARY KEY, v TEXT)"))
        helds: list[loopconn._HeldReader | None] = []
        real = loopconn._ready_later

        def counted(fileno: int, state: int, held: loopconn._HeldReader | None = None) -> int:
            helds.append(held)
            return real(fileno, state, held)

        monkeypatch.setattr(loopconn, "_ready_later", counted)
        sockets: list[tuple[int, LoopConnection]] = []

        def write(c: Conn) -> int:
            assert isinstance(c, PgConn) and isinstance(c.raw, LoopConnection)
            sockets.append((c.raw.pgconn.socket, c.raw))
            first = c.execute("SELECT count(*) FROM trips").fetchone()
            c.execute("INSERT INTO trips VALUES (?, ?)", (1, "one"))
            c.send("UPDATE trips SET v = v || '!' WHERE k = ?", (1,))
            return int(first[0])

        assert await pg.write(write) == 0
        assert len(helds) == 3 and helds[0] is not None, helds
        assert all(h is helds[0] for h in helds), helds
        [(fileno, raw)] = sockets
        assert raw._held is None
        assert not asyncio.get_running_loop().remove_reader(fileno)  # nothing left registered
        for k in range(2, 5):  # the pool's own waits (its rollback, its checks) and ours alternate
            await pg.write(lambda c, k=k: c.execute("INSERT INTO trips VALUES (?, ?)", (k, str(k))))
            assert await pg.read(lambda c: c.execute("SELECT count(*) FROM trips").fetchone()[0]) == k
    finally:
        await pg.close()


async def test_steps_that_need_no_wait_still_leave_the_loop_a_turn_now_and_then(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A long run of sends to a socket that takes them (a bulk insert's rows) never waits on
    the loop by itself: the greenlet gives the loop a turn once it has been busy MAX_BUSY
    seconds (here none, so at every step; and never, with an hour), and a wait state psycopg
    cannot mean is refused, not waited on forever."""
    here, there = socket.socketpair()
    turns = 0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal turns
        while not stop.is_set():
            turns += 1
            await asyncio.sleep(0)

    def sends(n: int) -> PQGen[str]:
        for _ in range(n):
            ready = yield WAIT_W
            assert ready & READY_W
        return "sent"

    def drive(n: int) -> str:
        return loopconn._drive_gen(sends(n), here.fileno())

    ticking = asyncio.create_task(ticker())
    try:
        await asyncio.sleep(0)
        monkeypatch.setattr(loopconn, "MAX_BUSY", 0.0)
        before = turns
        assert await loopconn.Runner().run(lambda: drive(200)) == "sent"
        assert turns - before >= 200
        monkeypatch.setattr(loopconn, "MAX_BUSY", 3600.0)
        before = turns
        assert await loopconn.Runner().run(lambda: drive(200)) == "sent"
        assert turns - before <= 3  # only the runner's own task switches

        def nonsense() -> PQGen[None]:
            yield 0  # neither reading nor writing
            return None

        with pytest.raises(psycopg.InternalError, match="bad poll status"):
            await loopconn.Runner().run(lambda: loopconn._drive_gen(nonsense(), here.fileno()))
    finally:
        stop.set()
        await ticking
        here.close()
        there.close()


async def test_a_bulk_write_through_the_loop_writes_every_row(pg: PgDatabase) -> None:
    """A bulk insert of many rows on one connection, its rows pipelined: all there, once."""
    await pg.write(lambda c: c.execute("CREATE TABLE bulk (k INTEGER PRIMARY KEY, v TEXT)"))

    def bulk(c: Conn) -> None:
        c.executemany("INSERT INTO bulk VALUES (?, ?)", [(k, "x" * 40) for k in range(20_000)])

    await pg.write(bulk)
    counted = await pg.read_one(
        lambda c: tuple(c.execute("SELECT count(*), count(DISTINCT k) FROM bulk").fetchone())
    )
    assert counted == (20_000, 20_000)
