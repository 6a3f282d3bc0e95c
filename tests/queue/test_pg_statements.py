"""What a PostgreSQL write sends: the rows it writes without reading back go as one statement
when they can (plain inserts into different tables), and a write that only read before them
needs no transaction around that one statement; a read that locks, and every read after a
write, still run inside the write's transaction. Real server for the behaviour, pure functions
for the rules."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import psycopg
import pytest

from nymph.queue.errors import Unavailable
from nymph.queue.pgdb import PgDatabase
from nymph.queue.sql.dialect import (
    NAMESPACE_KEYS,
    PARSED_PARAMETERS,
    Conn,
    PgConn,
    _merged,
    _native,
    _plain_read,
    _with,
    lock_key,
    send,
)
from tests.support.latency_proxy import LatencyProxy, pg_url_through
from tests.support.pg_server import PgServer

SCHEMA = (
    "CREATE TABLE parent (k INTEGER PRIMARY KEY, v TEXT)",
    "CREATE TABLE child (k INTEGER PRIMARY KEY, parent INTEGER NOT NULL REFERENCES parent (k), "
    "n INTEGER NOT NULL CHECK (n >= 0))",
    "CREATE TABLE log (id BIGSERIAL PRIMARY KEY, what TEXT)",
)


def test_plain_inserts_into_different_tables_go_as_one_statement_in_order() -> None:
    queued = [
        ("INSERT INTO parent (k, v) VALUES (?, ?)", (1, "a")),
        ("INSERT INTO child (k, parent, n) VALUES (?, ?, ?)", (10, 1, 0)),
        ("INSERT INTO log (what) VALUES (?)", ("x",)),
    ]
    [(sqls, params)] = list(_merged(queued))
    assert params == [1, "a", 10, 1, 0, "x"]
    assert _with(sqls) == (
        "WITH w0 AS (INSERT INTO parent (k, v) VALUES (%s, %s)), "
        "w1 AS (INSERT INTO child (k, parent, n) VALUES (%s, %s, %s)) "
        "INSERT INTO log (what) VALUES (%s)"
    )


def test_what_could_change_meaning_is_never_merged() -> None:
    """An insert into a table already in the run with other columns, an update (it would not
    see the inserts beside it), an insert that reads (the same) or has a conflict clause, and
    named parameters: each ends the run and goes alone, in order."""
    queued = [
        ("INSERT INTO log (what) VALUES (?)", ("1",)),
        ("INSERT INTO log (id, what) VALUES (?, ?)", (9, "2")),
        ("UPDATE parent SET v = ? WHERE k = ?", ("b", 1)),
        ("INSERT INTO child (k, parent, n) SELECT 11, k, 0 FROM parent", ()),
        ("INSERT INTO parent (k, v) VALUES (?, ?) ON CONFLICT DO NOTHING", (2, "c")),
        ("INSERT INTO parent (k, v) VALUES (:k, :v)", {"k": 3, "v": "d"}),
        ("INSERT INTO log (what) VALUES (?)", ("3",)),
    ]
    got = [(sqls, params) for sqls, params in _merged(queued)]
    assert [len(sqls) for sqls, _ in got] == [1] * 7
    assert [sqls[0] for sqls, _ in got] == [sql for sql, _ in queued]
    assert got[5][1] == {"k": 3, "v": "d"}


def test_the_same_insert_sent_again_adds_rows_to_one_insert_in_the_order_sent() -> None:
    """Launches of a batch each send the same inserts: each table's rows go as one insert of
    many rows, in the order they were sent, all in one statement."""
    queued = []
    for k in (1, 2, 3):
        queued.append(("INSERT INTO parent (k, v) VALUES (?, ?)", (k, f"p{k}")))
        queued.append(("INSERT INTO child (k, parent, n) VALUES (?, ?, 0)", (10 * k, k)))
        queued.append(("INSERT INTO log (what) VALUES (?)", (f"made {k}",)))
    [(sqls, params)] = list(_merged(queued))
    assert _with(sqls) == (
        "WITH w0 AS (INSERT INTO parent (k, v) VALUES (%s, %s), (%s, %s), (%s, %s)), "
        "w1 AS (INSERT INTO child (k, parent, n) VALUES (%s, %s, 0), (%s, %s, 0), (%s, %s, 0)) "
        "INSERT INTO log (what) VALUES (%s), (%s), (%s)"
    )
    assert params == [1, "p1", 2, "p2", 3, "p3", 10, 1, 20, 2, 30, 3, "made 1", "made 2", "made 3"]


def test_native_placeholders_are_numbered_in_order_and_leave_quoted_text_alone() -> None:
    sqls = (
        "INSERT INTO parent (k, v) VALUES (?, '?%'), (?, 'it''s ?')",
        'INSERT INTO log (what) VALUES (?), ("?")',
    )
    assert _native(sqls) == (
        "WITH w0 AS (INSERT INTO parent (k, v) VALUES ($1, '?%'), ($2, 'it''s ?')) "
        'INSERT INTO log (what) VALUES ($3), ("?")'
    )
    assert _native(("INSERT INTO log (what) VALUES (?)",)) == "INSERT INTO log (what) VALUES ($1)"


def test_a_run_is_cut_before_it_passes_the_parameter_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL takes at most 65,535 parameters in one statement: a run of inserts that would
    pass the limit goes as two statements, in order, each with its own parameters."""
    from nymph.queue.sql import dialect

    queued = [
        ("INSERT INTO parent (k, v) VALUES (?, ?)", (1, "a")),
        ("INSERT INTO child (k, parent, n) VALUES (?, ?, ?)", (10, 1, 0)),
        ("INSERT INTO log (what) VALUES (?)", ("x",)),
    ]
    assert [len(sqls) for sqls, _ in _merged(queued)] == [3]
    monkeypatch.setattr(dialect, "MAX_PARAMETERS", 4)
    got = list(_merged(queued))
    assert [sqls for sqls, _ in got] == [(queued[0][0],), (queued[1][0], queued[2][0])]
    assert [list(params) for _, params in got] == [[1, "a"], [10, 1, 0, "x"]]
    assert all(len(params) <= 4 for _, params in got)


@pytest.mark.parametrize(
    ("sql", "plain"),
    [
        ("SELECT v FROM parent WHERE k = ?", True),
        ("  select updated_at, deleted FROM t", True),
        ("SELECT v FROM parent WHERE k = ? FOR UPDATE", False),
        ("SELECT v FROM parent FOR NO KEY UPDATE SKIP LOCKED", False),
        ("SELECT v FROM parent FOR SHARE", False),
        ("SELECT pg_advisory_xact_lock(?, hashtext(?))", False),
        ("SELECT pg_try_advisory_xact_lock(?)", False),
        ("SELECT nextval('s')", False),
        ("WITH x AS (DELETE FROM t RETURNING k) SELECT count(*) FROM x", False),
        ("UPDATE parent SET v = 'x'", False),
    ],
)
def test_only_a_select_that_locks_and_writes_nothing_runs_before_the_transaction(
    sql: str, plain: bool
) -> None:
    assert _plain_read(sql) is plain


@pytest.fixture
async def pg(proxied: tuple[str, LatencyProxy]) -> AsyncIterator[PgDatabase]:
    db, proxy = proxied
    database = PgDatabase(url=pg_url_through(db, proxy.port), pool_size=2)
    await database.open()
    try:

        def schema(c: Conn) -> None:
            for sql in SCHEMA:
                c.execute(sql)

        await database.write(schema)
        yield database
    finally:
        await database.close()


async def _count(pg: PgDatabase, table: str) -> int:
    return int(await pg.read(lambda c: c.execute(f"SELECT count(*) FROM {table}").fetchone()[0]))


async def test_a_read_then_rows_that_make_one_statement_cost_two_round_trips_and_land_together(
    pg: PgDatabase, proxied: tuple[str, LatencyProxy]
) -> None:
    """A write that reads, then sends a parent, its child and a log line: the read alone, the
    three rows in one statement (no BEGIN, no COMMIT: two round trips), all there after it; a
    write that only reads sends nothing after its read."""
    _, proxy = proxied

    def write(c: Conn) -> int:
        (n,) = c.execute("SELECT count(*) FROM parent").fetchone()
        send(c, "INSERT INTO parent (k, v) VALUES (?, ?)", (n + 1, "p"))
        send(c, "INSERT INTO child (k, parent, n) VALUES (?, ?, ?)", (100 + n, n + 1, 0))
        send(c, "INSERT INTO log (what) VALUES (?)", ("made",))
        return int(n)

    await pg.write(write)  # warm: the pool's connections are open
    before = proxy.round_trips
    await pg.write(write)
    assert proxy.round_trips - before == 2
    assert (await _count(pg, "parent"), await _count(pg, "child"), await _count(pg, "log")) == (2, 2, 2)
    before = proxy.round_trips
    assert await pg.write(lambda c: c.execute("SELECT count(*) FROM parent").fetchone()[0]) == 2
    assert proxy.round_trips - before == 1


async def test_rows_sent_as_one_statement_are_all_or_nothing(pg: PgDatabase) -> None:
    """When the last row of one statement breaks a check, the rows before it in the same
    statement are not written either, with or without a transaction begun before them; so is a
    child whose parent does not exist."""

    def broken(c: Conn) -> None:
        send(c, "INSERT INTO parent (k, v) VALUES (?, ?)", (1, "p"))
        send(c, "INSERT INTO log (what) VALUES (?)", ("made",))
        send(c, "INSERT INTO child (k, parent, n) VALUES (?, ?, ?)", (10, 1, -1))

    with pytest.raises(psycopg.errors.CheckViolation):
        await pg.write(broken)

    def orphan(c: Conn) -> None:
        send(c, "INSERT INTO log (what) VALUES (?)", ("orphan",))
        send(c, "INSERT INTO child (k, parent, n) VALUES (?, ?, ?)", (11, 99, 0))

    with pytest.raises(psycopg.errors.ForeignKeyViolation):
        await pg.write(orphan)

    def begun_then_broken(c: Conn) -> None:
        c.execute("UPDATE parent SET v = 'never' WHERE k = 1")  # begins the transaction
        broken(c)

    with pytest.raises(psycopg.errors.CheckViolation):
        await pg.write(begun_then_broken)
    assert (await _count(pg, "parent"), await _count(pg, "child"), await _count(pg, "log")) == (0, 0, 0)


async def test_many_rows_of_one_insert_land_in_order_with_their_own_values(
    pg: PgDatabase, proxied: tuple[str, LatencyProxy]
) -> None:
    """A hundred launches' worth of rows (more parameters than psycopg keeps parsed: they go
    with PostgreSQL's own placeholders): one statement, one round trip, every value as sent
    (``%`` and ``?`` in them included), each table's rows in the order sent."""
    _, proxy = proxied
    rows = 100
    assert rows * 3 > PARSED_PARAMETERS

    def write(c: Conn) -> None:
        for k in range(rows):
            send(c, "INSERT INTO parent (k, v) VALUES (?, ?)", (k, f"{k}% ?"))
            send(c, "INSERT INTO log (what) VALUES (?)", (f"made {k}",))
            send(c, "INSERT INTO child (k, parent, n) VALUES (?, ?, 0)", (1000 + k, k))

    await pg.write(lambda c: c.execute("SELECT 1").fetchone())  # warm: a connection is open
    before = proxy.round_trips
    await pg.write(write)
    assert proxy.round_trips - before == 1
    parents = await pg.read(lambda c: [tuple(r) for r in c.execute("SELECT k, v FROM parent ORDER BY k")])
    assert parents == [(k, f"{k}% ?") for k in range(rows)]
    logs = await pg.read(lambda c: [r[0] for r in c.execute("SELECT what FROM log ORDER BY id")])
    assert logs == [f"made {k}" for k in range(rows)]
    assert await _count(pg, "child") == rows


async def test_statements_sent_since_a_mark_are_dropped_unless_they_ran(pg: PgDatabase) -> None:
    """A launch refused inside a batch takes back the rows it sent, which are then never
    written; once a statement ran (a read after them), they cannot be taken back."""

    def write(c: Conn) -> tuple[bool, bool]:
        assert isinstance(c, PgConn)
        send(c, "INSERT INTO parent (k, v) VALUES (?, ?)", (1, "kept"))
        mark = c.mark()
        send(c, "INSERT INTO parent (k, v) VALUES (?, ?)", (2, "dropped"))
        send(c, "INSERT INTO log (what) VALUES (?)", ("dropped",))
        dropped = c.undo(mark)
        mark = c.mark()
        send(c, "INSERT INTO log (what) VALUES (?)", ("ran",))
        c.execute("SELECT count(*) FROM log").fetchone()  # runs what was sent
        return dropped, c.undo(mark)

    assert await pg.write(write) == (True, False)
    assert await pg.read(lambda c: [tuple(r) for r in c.execute("SELECT k, v FROM parent")]) == [(1, "kept")]
    assert await pg.read(lambda c: [r[0] for r in c.execute("SELECT what FROM log")]) == ["ran"]


async def test_a_notify_told_with_a_write_is_heard_once_it_commits_in_the_statement_of_its_rows(
    pg: PgDatabase, proxied: tuple[str, LatencyProxy]
) -> None:
    """A launch batch tells the other replicas of its tasks inside its write: with rows that make
    one statement, the notify is that statement's own query (no round trip of its own); it is
    heard after the commit, never for a write that failed, and a write that began its
    transaction sends it before its COMMIT."""
    db, proxy = proxied
    listener = await psycopg.AsyncConnection.connect(db, autocommit=True)
    try:
        await listener.execute("LISTEN told")

        async def heard() -> list[str]:
            return [n.payload async for n in listener.notifies(timeout=0.5)]

        def rows(c: Conn) -> None:
            send(c, "INSERT INTO parent (k, v) VALUES (?, ?)", (1, "p"))
            send(c, "INSERT INTO log (what) VALUES (?)", ("x",))
            assert isinstance(c, PgConn)
            c.tell("told", "one")
            c.tell("told", "two")

        await pg.write(lambda c: c.execute("SELECT 1").fetchone())  # warm
        before = proxy.round_trips
        await pg.write(rows)
        assert proxy.round_trips - before == 1
        assert await heard() == ["one", "two"]

        def broken(c: Conn) -> None:
            send(c, "INSERT INTO child (k, parent, n) VALUES (?, ?, ?)", (10, 99, 0))  # no parent 99
            assert isinstance(c, PgConn)
            c.tell("told", "never")

        with pytest.raises(psycopg.errors.ForeignKeyViolation):
            await pg.write(broken)
        assert await heard() == []

        def begun(c: Conn) -> None:
            c.execute("UPDATE parent SET v = 'q' WHERE k = 1")  # begins the transaction
            send(c, "INSERT INTO log (what) VALUES (?)", ("y",))
            assert isinstance(c, PgConn)
            c.tell("told", "three")

        await pg.write(begun)
        assert await heard() == ["three"]
        assert await _count(pg, "log") == 2
    finally:
        await listener.close()


async def test_a_read_after_a_write_sees_it_and_an_error_after_it_writes_nothing(pg: PgDatabase) -> None:
    """A read that follows rows sent without reading back runs in the write's transaction (it
    sees them); an error after that read rolls the rows back."""
    seen: list[int] = []

    class Refused(Exception):
        pass

    def write(c: Conn) -> None:
        send(c, "INSERT INTO parent (k, v) VALUES (?, ?)", (7, "p"))
        seen.append(int(c.execute("SELECT count(*) FROM parent").fetchone()[0]))
        raise Refused

    with pytest.raises(Refused):
        await pg.write(write)
    assert seen == [1]
    assert await _count(pg, "parent") == 0


async def test_a_lock_taken_by_a_read_is_held_until_the_write_ends(
    pg: PgDatabase, proxied: tuple[str, LatencyProxy]
) -> None:
    """A row locked by ``FOR UPDATE`` and an advisory lock taken by a write, after a plain read
    (which ran on its own): both held by the write until it commits, seen from another
    connection; free after it."""
    db, _ = proxied
    await pg.write(lambda c: c.execute("INSERT INTO parent (k, v) VALUES (1, 'p')"))
    held: list[tuple[bool, bool]] = []

    def other_can_lock() -> tuple[bool, bool]:
        with psycopg.connect(db, autocommit=True) as other:
            try:
                other.execute("SELECT k FROM parent WHERE k = 1 FOR UPDATE NOWAIT")
                row = True
            except psycopg.errors.LockNotAvailable:
                row = False
            (advisory,) = other.execute(
                "SELECT pg_try_advisory_lock(%s, hashtext(%s))", (NAMESPACE_KEYS, "team-a")
            ).fetchone() or (False,)
            if advisory:
                other.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", (NAMESPACE_KEYS, "team-a"))
            return row, bool(advisory)

    def write(c: Conn) -> None:
        c.execute("SELECT v FROM parent WHERE k = 1").fetchone()
        c.execute("SELECT v FROM parent WHERE k = 1 FOR UPDATE").fetchone()
        lock_key(c, NAMESPACE_KEYS, "team-a")
        held.append(other_can_lock())
        send(c, "INSERT INTO log (what) VALUES (?)", ("locked",))

    await pg.write(write)
    assert held == [(False, False)]
    assert other_can_lock() == (True, True)
    assert await _count(pg, "log") == 1


async def test_a_lone_write_whose_answer_is_lost_is_told_and_never_run_again(pg_server: PgServer) -> None:
    """A write sent as one statement without a transaction, whose connection is lost before its
    answer: the caller is told its outcome is not known (never that nothing changed), and the
    write is not run again (it may have happened, as a COMMIT whose answer was lost may have)."""
    db = pg_server.fresh_database()
    proxy = LatencyProxy(target_unix=str(pg_server.socket_dir / f".s.PGSQL.{pg_server.port}"), delay=0.05)
    await proxy.start()
    pg = PgDatabase(url=pg_url_through(db, proxy.port), pool_size=1)
    try:
        await pg.open()
        await pg.write(lambda c: c.execute("CREATE TABLE log (id BIGSERIAL PRIMARY KEY, what TEXT)"))
        runs: list[int] = []

        def write(c: Conn) -> None:
            runs.append(1)
            send(c, "INSERT INTO log (what) VALUES (?)", ("once",))

        sent = asyncio.create_task(pg.write(write))
        await asyncio.sleep(0.02)  # sent; its answer cannot be back before 0.1 s
        assert proxy.in_flight == 1
        proxy.cut()  # a connection made now would work: running the write again would succeed
        with pytest.raises(Unavailable, match="whether it was made is not known") as lost:
            await sent
        assert "nothing was changed" not in str(lost.value)
        assert runs == [1]
    finally:
        await pg.close()
        await proxy.close()
        pg_server.drop_database(db)
