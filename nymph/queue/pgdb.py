"""The queue's state in PostgreSQL: a connection pool, migrations, transactions, wake-ups.

The same synchronous SQL functions as on SQLite (:mod:`nymph.queue.sql`) run here through
:class:`~nymph.queue.sql.dialect.PgConn`, each transaction in a greenlet on the event loop's own
thread (:mod:`nymph.queue.loopconn`: its waits for the server are served by the loop, so
transactions overlap their round trips without a thread per transaction), with an asyncio
psycopg connection pool behind it, so that :class:`PgDatabase` offers exactly
:class:`nymph.queue.db.Database`'s ``write`` / ``read``.

Concurrency across replicas: write transactions run at once, on any replica, as ``READ
COMMITTED`` (each statement sees what was committed when it started), so writes to different
launches never wait for each other. A write begins its transaction only when it needs one
(:class:`~nymph.queue.sql.dialect.PgConn`): plain reads before its first write run as
statements of their own, and a write whose rows make one statement sends it alone, without
``BEGIN`` or ``COMMIT``. What keeps them correct is in the SQL
(:mod:`nymph.queue.sql.dialect`'s lock helpers): a write that decides from a row locks it
first (an instance's row, by :func:`~nymph.queue.sql.rows.fetch_instance`: the writes of one
instance run one after another; a task's row when a completion reads it; a report stream's
row), conditional updates (``UPDATE ... WHERE status = 'pending'``) where a row may have moved
on since it was read, unique keys for what must exist once (an Idempotency-Key, a provider's
name), advisory locks for names no row stands for yet (a namespace's claims and quota, a
daemon id's sessions). A claim leases with ``FOR UPDATE SKIP LOCKED`` (never waiting for, or
handing out twice, a task another replica's claim is leasing), or, for launches the scheduler
orders, under its namespaces' locks. A write PostgreSQL aborts for a deadlock or a
serialization failure, or that meets a unique key another write committed meanwhile (an
Idempotency-Key sent twice at once), is run again from its start, a few times
(:data:`WRITE_ATTEMPTS`): every write function is safe to run again. Reads run as ``REPEATABLE
READ READ ONLY`` (one snapshot of committed writes, like a SQLite read transaction) and lock
nothing; a read of one statement (``read_one``: a token, a session, a provider) is sent alone,
outside a transaction, its own snapshot.

Migrations are applied once, by whichever replica takes the migration advisory lock first.
Wake-ups cross replicas with ``LISTEN`` / ``NOTIFY`` (:class:`Listener`). A database that
cannot be reached makes a call fail fast with :class:`~nymph.queue.errors.Unavailable` (503).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import secrets
import weakref
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

import psycopg
import psycopg_pool
import structlog
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus

from nymph.queue import loopconn
from nymph.queue.broadcast import coalesce
from nymph.queue.db import DatabaseError
from nymph.queue.errors import Conflict, Unavailable
from nymph.queue.loopconn import LoopConnection, await_only
from nymph.queue.sql import events
from nymph.queue.sql.dialect import UNIQUE_CONFLICTS, Conn, PgConn, pg_row_factory
from nymph.queue.sql.pg_migrations import PG_MIGRATIONS

T = TypeVar("T")
log = structlog.get_logger(__name__, component="queue.pgdb")

#: Advisory lock keys (bigints; the singletons' keys are in :mod:`nymph.queue.db`, the per-name
#: classes in :mod:`nymph.queue.sql.dialect`).
MIGRATE_LOCK = 0x6E796D7068_02
CHANNEL = "nymph_queue"
#: How often a replica that does not hold a singleton lock tries for it (and the holder checks
#: its connection).
LOCK_POLL = 2.0
UNREACHABLE = "the queue database cannot be reached right now: nothing was changed; retry shortly"
#: A write whose statement or COMMIT was sent, and whose connection was lost before the answer.
OUTCOME_UNKNOWN = (
    "the queue database was lost before it confirmed this change, so whether it was made is not "
    "known: check before sending it again (a launch sent with an Idempotency-Key can be sent "
    "again safely)"
)
#: How many times a write is run from its start when it meets another write (see the module doc).
WRITE_ATTEMPTS = 6
#: Broadcasts sent in one statement at most.
_NOTIFY_BATCH = 100
#: Errors that mean "another write got there first": the transaction is run again.
_CONFLICTS = (
    psycopg.errors.SerializationFailure,
    psycopg.errors.DeadlockDetected,
    psycopg.errors.UniqueViolation,
)


def _unique_conflict(exc: Exception) -> Conflict | None:
    """The 409 a unique constraint broken on purpose stands for (:data:`UNIQUE_CONFLICTS`)."""
    if not isinstance(exc, psycopg.errors.UniqueViolation):
        return None
    known = UNIQUE_CONFLICTS.get(exc.diag.constraint_name or "")
    return None if known is None else Conflict(known[0], code=known[1])


def is_url(value: str) -> bool:
    return value.startswith(("postgresql://", "postgres://"))


def describe(url: str) -> str:
    """The database's host and name for logs (never the password)."""
    try:
        info = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "postgresql (unparsable URL)"
    host = info.get("host") or "localhost"
    return f"postgresql {host}:{info.get('port') or 5432}/{info.get('dbname') or ''}"


def migrate(raw: psycopg.Connection[Any]) -> int:
    """Apply the migrations the database has not had yet (``raw`` in autocommit mode)."""
    raw.execute("SELECT pg_advisory_lock(%s)", (MIGRATE_LOCK,))
    try:
        raw.execute("CREATE TABLE IF NOT EXISTS nymph_schema (version INTEGER NOT NULL)")
        row = raw.execute("SELECT version FROM nymph_schema").fetchone()
        if row is None:
            raw.execute("INSERT INTO nymph_schema (version) VALUES (0)")
            version = 0
        else:
            version = int(row[0])
        if version > len(PG_MIGRATIONS):
            raise DatabaseError(
                f"the queue database has schema version {version} but this nymph knows only "
                f"{len(PG_MIGRATIONS)}: upgrade nymph or use another --db"
            )
        for index in range(version, len(PG_MIGRATIONS)):
            with raw.transaction():
                raw.execute(PG_MIGRATIONS[index])
                raw.execute("UPDATE nymph_schema SET version = %s", (index + 1,))
            log.info("migrated", version=index + 1)
        return len(PG_MIGRATIONS)
    finally:
        raw.execute("SELECT pg_advisory_unlock(%s)", (MIGRATE_LOCK,))


def connect_and_migrate(url: str, *, timeout: float = 10.0) -> int:
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=max(1, int(timeout))) as raw:
            return migrate(raw)
    except psycopg.Error as exc:
        raise DatabaseError(f"cannot open the queue database ({describe(url)}): {exc}") from None


def _rollback(raw: psycopg.Connection[Any]) -> None:
    """Roll back the transaction under way, if one is (a statement of its own, or a write that
    never began its transaction, has nothing to roll back)."""
    if raw.info.transaction_status != TransactionStatus.IDLE:
        with contextlib.suppress(psycopg.Error):
            raw.execute("ROLLBACK")


def _broken(exc: BaseException) -> bool:
    return isinstance(exc, psycopg_pool.PoolTimeout) or (
        isinstance(exc, psycopg.OperationalError)
        and not isinstance(
            exc,
            psycopg.errors.SerializationFailure
            | psycopg.errors.DeadlockDetected
            | psycopg.errors.QueryCanceled,
        )
    )


class PgDatabase:
    """The service's PostgreSQL connections; same interface as :class:`nymph.queue.db.Database`."""

    #: Every replica on the database hears :meth:`broadcast`.
    relays = True
    #: Each write is round trips to the server and a commit: launches that come together share them.
    batches_launches = True

    def __init__(self, *, url: str, pool_size: int = 16, timeout: float = 3.0) -> None:
        self.url = url
        self.pool_size = pool_size
        self.timeout = timeout
        #: This replica, in the payload of its NOTIFYs (it ignores its own).
        self.replica = secrets.token_hex(6)
        self._pool: psycopg_pool.AsyncConnectionPool[Any] | None = None
        #: The transactions under way (each in a greenlet on the loop's thread).
        self._transactions = loopconn.Runner()
        #: Each pooled connection's synchronous twin (:class:`LoopConnection`), made once so
        #: that its prepared statements are kept.
        self._twins: weakref.WeakKeyDictionary[psycopg.AsyncConnection[Any], LoopConnection] = (
            weakref.WeakKeyDictionary()
        )
        #: Broadcast keys not sent yet, and the task sending them (see :meth:`broadcast`).
        self._outbox: list[str] = []
        self._sender: asyncio.Task[None] | None = None
        #: Seals asked for and not started yet (each asker's future, and whether it wakes the
        #: followers), and the task sealing (see :meth:`seal_events`).
        self._seals_asked: list[tuple[asyncio.Future[None], bool]] = []
        self._sealer: asyncio.Task[None] | None = None
        self.events_written: Callable[[frozenset[str]], None] = lambda namespaces: None

    @property
    def describe(self) -> str:
        return describe(self.url)

    async def open(self) -> None:
        await asyncio.to_thread(connect_and_migrate, self.url)
        pool: psycopg_pool.AsyncConnectionPool[Any] = psycopg_pool.AsyncConnectionPool(
            self.url,
            min_size=1,
            max_size=self.pool_size,
            # The pool's own statements (a rollback on return) are never prepared: the twin
            # prepares on the same server session, and their names must not meet.
            kwargs={"autocommit": True, "application_name": "nymph-queue", "prepare_threshold": None},
            timeout=self.timeout,
            reconnect_timeout=0,
            open=False,
            name="nymph-queue",
        )
        try:
            await pool.open(wait=True, timeout=self.timeout)
        except psycopg_pool.PoolTimeout:
            await pool.close()
            raise DatabaseError(f"cannot connect to the queue database ({self.describe})") from None
        self._pool = pool

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        await self._transactions.drain(timeout=5)
        for task in (self._sealer, self._sender):
            if task is not None:
                await asyncio.wait({task}, timeout=5)
        await pool.close(timeout=5)

    def _twin(self, aconn: psycopg.AsyncConnection[Any]) -> LoopConnection:
        twin = self._twins.get(aconn)
        if twin is None:
            twin = self._twins[aconn] = LoopConnection.twin(aconn, row_factory=pg_row_factory)
        return twin

    async def write(self, fn: Callable[[PgConn], T]) -> T:
        """Run ``fn`` in one write transaction, again from its start when it meets another write
        (see the module doc). Its events get their cursors when they are first read
        (:meth:`seal_events`): the write neither waits for that nor pays for it."""
        result, namespaces = await self._run(
            events.collecting(fn), begin="BEGIN ISOLATION LEVEL READ COMMITTED", writing=True
        )
        if namespaces:
            self.events_written(namespaces)
        return result

    async def seal_events(self, *, wake: bool = False) -> None:
        """Seal the events committed before this call (by a sealing statement that starts after
        it; calls that come together share one); with ``wake``, wake the followers of the
        namespaces it sealed events of."""
        if self._pool is None:
            raise DatabaseError("the queue database is not open")
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._seals_asked.append((done, wake))
        if self._sealer is None or self._sealer.done():
            self._sealer = asyncio.get_running_loop().create_task(self._seal(), name="nymph-queue-pg-seal")
        await asyncio.shield(done)

    async def _seal(self) -> None:
        """Seal until no one asks: each round answers those who asked before it started (its
        statement's snapshot is taken after their calls). A failed round leaves the events to
        the next read or sweep; those who asked are told."""
        while self._seals_asked:
            asked, self._seals_asked = self._seals_asked, []
            error: BaseException | None = None
            try:
                namespaces = await self._run(events.seal, begin=None, writing=True)
            except Exception as exc:  # the task is guarded: every asker is answered
                log.warning(
                    "events not sealed yet; the next read or sweep seals them", error=exc.__class__.__name__
                )
                error = exc  # a lost database is already Unavailable (see _run)
            else:
                if namespaces and any(wake for _, wake in asked):
                    self.events_written(namespaces)
            for done, _ in asked:
                if done.done():
                    continue
                if error is None:
                    done.set_result(None)
                else:
                    done.set_exception(error)

    async def read(self, fn: Callable[[PgConn], T]) -> T:
        return await self._run(fn, begin="BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", writing=False)

    async def read_small(self, fn: Callable[[PgConn], T]) -> T:
        """A read like any other: every read is a network round trip away."""
        return await self.read(fn)

    async def read_one(self, fn: Callable[[PgConn], T]) -> T:
        """A read of one statement, sent alone (autocommit: the statement is its own snapshot),
        without ``BEGIN`` and ``COMMIT`` around it: one round trip, not three. A second
        statement is refused (:class:`~nymph.queue.sql.dialect.PgConn`'s ``single``)."""
        return await self._run(fn, begin=None, writing=False)

    async def _run(self, fn: Callable[[PgConn], T], *, begin: str | None, writing: bool) -> T:
        if self._pool is None:
            raise DatabaseError("the queue database is not open")
        try:
            return await self._transactions.run(lambda: self._job(fn, begin=begin, writing=writing))
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            if _broken(exc):
                log.warning("database unreachable", error=exc.__class__.__name__)
                raise Unavailable(UNREACHABLE) from None
            raise

    def _job(self, fn: Callable[[PgConn], T], *, begin: str | None, writing: bool) -> T:
        """``fn`` in a transaction (on the loop's thread, in a greenlet of
        :meth:`nymph.queue.loopconn.Runner.run`), run again as the module doc says."""
        pool = self._pool
        if pool is None:
            raise DatabaseError("the queue database is not open")
        reconnects = conflicts = 0
        while True:
            aconn: psycopg.AsyncConnection[Any] | None = await_only(pool.getconn())
            try:
                assert aconn is not None
                raw = self._twin(aconn)
                raw.hold()
                conn = PgConn(raw, writing=writing, single=begin is None, begin=begin if writing else None)
                if begin is not None and not writing:
                    conn.send(begin)  # sent with the first statement: no round trip of its own
                try:
                    result = fn(conn)
                    if begin is not None:
                        conn.commit()
                except _CONFLICTS as exc:
                    _rollback(raw)
                    conflicts += 1
                    if conflicts == WRITE_ATTEMPTS:
                        answer = _unique_conflict(exc)
                        if answer is not None:
                            raise answer from None
                        raise
                    log.debug("write met another one; running it again", error=exc.__class__.__name__)
                except psycopg.OperationalError:
                    # A connection found dead (a restarted server) before anything was
                    # committed: nothing happened, so run it again on another one, after
                    # dropping every dead connection at once. Once the COMMIT was sent,
                    # whether it happened is unknown: the caller is told (a 503).
                    lost = raw.closed or raw.broken
                    if conn.commit_sent and lost:
                        log.warning("database lost before a write's answer; its outcome is unknown")
                        raise Unavailable(OUTCOME_UNKNOWN) from None
                    if not lost:
                        _rollback(raw)
                        raise
                    reconnects += 1
                    if reconnects == 3:
                        raise
                    raw.release()
                    await_only(pool.putconn(aconn))
                    aconn = None
                    await_only(pool.check())
                    continue
                except BaseException:
                    _rollback(raw)
                    raise
                else:
                    return result
            finally:
                if aconn is not None:
                    self._twin(aconn).release()
                    await_only(pool.putconn(aconn))
            await_only(asyncio.sleep(random.uniform(0, 0.002 * 2**conflicts)))

    async def try_singleton(self, key: int, fn: Callable[[PgConn], T]) -> tuple[bool, T | None]:
        """Run ``fn`` in a write transaction only if no other replica holds ``key`` right now."""

        def guarded(conn: PgConn) -> tuple[bool, T | None]:
            if not conn.execute("SELECT pg_try_advisory_xact_lock(?)", (key,)).fetchone()[0]:
                return False, None
            return True, fn(conn)

        return await self.write(guarded)

    def broadcast(self, key: str) -> None:
        """Tell the other replicas (``key``: an instance id, or empty for "tasks changed").
        Fire and forget: a lost wake-up only delays a long-poll until its timeout. Keys told
        while a send is under way go together in the next one (one statement, the keys
        :func:`~nymph.queue.broadcast.coalesce`d), so a burst of writes sends a few."""
        if self._pool is None:
            return
        self._outbox.append(key)
        if self._sender is None or self._sender.done():
            self._sender = asyncio.get_running_loop().create_task(
                self._send(), name="nymph-queue-pg-broadcast"
            )

    def broadcast_with(self, conn: Conn, keys: Sequence[str]) -> None:
        """Tell the other replicas ``keys`` (:func:`~nymph.queue.broadcast.coalesce`d) with the
        commit of ``conn``'s write, in its last statement (:meth:`PgConn.tell`): no statement
        or round trip of its own."""
        if not isinstance(conn, PgConn):
            raise TypeError("broadcast_with needs a connection of this database's write")
        for payload in self._payloads(keys):
            conn.tell(CHANNEL, payload)

    def _payloads(self, keys: Sequence[str]) -> list[str]:
        """The ``NOTIFY`` payloads of ``keys`` (coalesced), each naming this replica (the
        listener ignores its own)."""
        return [f"{self.replica}:{key}" for key in coalesce(list(keys))]

    async def _send(self) -> None:
        while self._outbox:
            keys, self._outbox = self._outbox, []
            payloads = self._payloads(keys)
            for start in range(0, len(payloads), _NOTIFY_BATCH):
                # one statement on its own (autocommit), run as the transactions are
                notify = functools.partial(_notify, payloads[start : start + _NOTIFY_BATCH])
                with contextlib.suppress(psycopg.Error, psycopg_pool.PoolTimeout, Unavailable, DatabaseError):
                    await self._run(notify, begin=None, writing=True)

    async def exclusive(self, key: int, run: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run ``run`` only while this replica holds the session advisory lock ``key`` (wait for
        it otherwise). The lock lives with one connection: when the holder dies, or loses the
        database, the lock is released and another replica takes over; a holder that loses its
        connection stops ``run`` and waits for the lock again."""
        while True:
            try:
                await self._exclusive_once(key, run)
                return
            except (psycopg.Error, OSError) as exc:
                log.warning("lost the singleton lock's connection; waiting for it again", error=str(exc))
                await asyncio.sleep(LOCK_POLL)

    async def _exclusive_once(self, key: int, run: Callable[[], Coroutine[Any, Any, None]]) -> None:
        conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True, connect_timeout=5)
        async with conn:
            while True:
                cur = await conn.execute("SELECT pg_try_advisory_lock(%s)", (key,))
                row = await cur.fetchone()
                if row is not None and row[0]:
                    break
                await asyncio.sleep(LOCK_POLL)
            log.info("singleton lock taken", lock=key)
            task = asyncio.create_task(run())
            try:
                while not task.done():
                    await asyncio.wait({task}, timeout=LOCK_POLL)
                    if not task.done():
                        await conn.execute("SELECT 1")  # still connected, so still holding it
            finally:
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
            await task

    async def listen(self, on_wake: Callable[[str], None], *, ready: asyncio.Event | None = None) -> None:
        """Deliver other replicas' broadcasts to ``on_wake`` until cancelled, reconnecting after
        a lost connection (and waking everyone then: a broadcast may have been missed)."""
        await Listener(url=self.url, replica=self.replica, on_wake=on_wake).run(ready=ready)


class Listener:
    def __init__(self, *, url: str, replica: str, on_wake: Callable[[str], None]) -> None:
        self.url = url
        self.replica = replica
        self.on_wake = on_wake

    async def run(self, *, ready: asyncio.Event | None = None) -> None:
        delay = 0.2
        first = True
        while True:
            try:
                await self._once(ready=ready, first=first)
            except (psycopg.Error, OSError) as exc:
                log.warning("notification listener lost its connection; reconnecting", error=str(exc))
            first = False
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def _once(self, *, ready: asyncio.Event | None, first: bool) -> None:
        conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True, connect_timeout=5)
        async with conn:
            await conn.execute(f"LISTEN {CHANNEL}")
            if ready is not None:
                ready.set()
            if not first:
                self.on_wake("")  # anything may have changed while the connection was down
            async for note in conn.notifies():
                replica, _, key = note.payload.partition(":")
                if replica != self.replica:
                    self.on_wake(key)


def _notify(payloads: list[str], conn: PgConn) -> None:
    """``pg_notify`` each payload on :data:`CHANNEL`, in one statement."""
    conn.execute(
        "SELECT " + ", ".join(["pg_notify(?, ?)"] * len(payloads)),
        [v for p in payloads for v in (CHANNEL, p)],
    )


def write_once(url: str, fn: Callable[[PgConn], T]) -> T:
    """One write transaction on its own connection, migrating first (the CLI's token verbs)."""
    connect_and_migrate(url)
    try:
        with (
            psycopg.connect(url, autocommit=True, row_factory=pg_row_factory, connect_timeout=10) as raw,
            raw.transaction(),
        ):
            conn = PgConn(raw)
            result = fn(conn)
            conn.flush()
            return result
    except psycopg.OperationalError as exc:
        raise DatabaseError(f"cannot open the queue database ({describe(url)}): {exc}") from None
