"""The SQLite file: connection settings, migrations and transactions.

Every database call runs on **one dedicated thread that owns the only connection** of the
service (``Database.write`` / ``Database.read`` hand a function to that thread and await it).
Why not inline on the event loop: with ``synchronous=FULL`` each commit waits for an fsync,
which takes milliseconds on a quiet disk and far longer on a busy one; inline, that would stall
every held long-poll, the sweeper and all other requests. Why one thread and not a pool:
SQLite admits one writer at a time anyway, a single owner thread never shares a connection
across threads, and it serialises the service's own transactions so they never wait on each
other's locks (``busy_timeout`` only matters for another process, e.g. ``token create``). Every
transaction is short, so the queue in front of that thread stays short.

Durability: WAL journal, ``synchronous=FULL`` (a committed transaction survives a ``kill -9``
and a power cut), and each state change is one transaction (``BEGIN IMMEDIATE`` for writes, so
a claim reads and updates the tasks it hands out with the write lock held).

Small reads (``Database.read_small``: a few rows by index, such as a session by its digest or a
claim that finds nothing to take) run inline on the event loop instead, on a second, read-only
connection the loop owns: a WAL reader never waits for the writer or an fsync, and for a read
that short the hand-off to the thread and back cost more CPU than the read (about half of what
an idle claim long-poll sent again cost the queue). A read that finds the file busy (a
checkpoint resetting the WAL) goes to the thread instead.

Group commit: writes that queue up while the thread is busy run together, in order, each in a
savepoint of one transaction, with one commit (one fsync) for all of them. Each caller gets its
own result or exception (a failed write rolls back to its savepoint alone) only after that
commit, so what it was told is as durable as before; under load the fsyncs per launch fall
from one per request to one per group.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import urllib.parse
from collections.abc import Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar

import structlog

from nymph.errors import NymphError
from nymph.queue.dbfiles import DatabaseFileError, make_private
from nymph.queue.dbthread import DbThread
from nymph.queue.sql import events
from nymph.queue.sql.dialect import Conn, setup_sqlite
from nymph.queue.sql.migrations import MIGRATIONS

T = TypeVar("T")
log = structlog.get_logger(__name__, component="queue.db")


class DatabaseError(NymphError):
    """The database cannot be opened or has a schema this version does not know."""


#: Advisory lock keys of the work one replica at a time does (PostgreSQL; SQLite has one process).
SWEEP_LOCK = 0x6E796D7068_03
DIRECT_LOCK = 0x6E796D7068_04


class Backend(Protocol):
    """What the store needs of a database: :class:`Database` (SQLite) or
    :class:`nymph.queue.pgdb.PgDatabase` (PostgreSQL)."""

    #: Called after each commit that added events, with their namespaces (the store wakes the
    #: event followers with it).
    events_written: Callable[[frozenset[str]], None]

    @property
    def describe(self) -> str: ...

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def write(self, fn: Callable[[Conn], T]) -> T:
        """Run ``fn`` in one write transaction. PostgreSQL may run it more than once (from its
        start, when it met another write): ``fn`` does nothing but SQL on ``conn``."""
        ...

    async def read(self, fn: Callable[[Conn], T]) -> T: ...

    async def read_small(self, fn: Callable[[Conn], T]) -> T:
        """Like :meth:`read`, for a read of a few rows by index (it may run on the event loop)."""
        ...

    async def read_one(self, fn: Callable[[Conn], T]) -> T:
        """Like :meth:`read_small`, for a read of **one statement** (a token or a session by its
        digest, a provider by its name): that statement is its own snapshot, so PostgreSQL runs
        it without a transaction around it (one round trip, not three)."""
        ...

    async def try_singleton(self, key: int, fn: Callable[[Conn], T]) -> tuple[bool, T | None]: ...

    async def seal_events(self, *, wake: bool = False) -> None:
        """Give the committed events that have no cursor yet theirs; with ``wake``, wake the
        followers of their namespaces (PostgreSQL: see :mod:`nymph.queue.sql.events`; SQLite
        gives cursors as it writes)."""
        ...

    #: Whether :meth:`broadcast` reaches other replicas (what it costs to say is then worth it).
    relays: bool

    #: Whether launch POSTs that arrive together are written together
    #: (:mod:`nymph.queue.launchbatch`): where each write costs round trips to a server.
    batches_launches: bool

    def broadcast(self, key: str) -> None: ...

    def broadcast_with(self, conn: Conn, keys: Sequence[str]) -> None:
        """Tell the other replicas ``keys`` when ``conn``'s write commits (inside the write, in
        its last statement: never told of a write that did not commit, nor left untold of one
        that did)."""
        ...

    async def exclusive(self, key: int, run: Callable[[], Coroutine[Any, Any, None]]) -> None: ...


def connect(path: Path) -> sqlite3.Connection:
    """Open ``path`` with the service's pragmas and bring its schema up to date. The file and
    its -wal / -shm files are 0600, whoever creates them (:mod:`nymph.queue.dbfiles`)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        make_private(path)
        conn = sqlite3.connect(str(path), isolation_level=None, timeout=10.0)
    except DatabaseFileError as exc:
        raise DatabaseError(str(exc)) from exc
    except (OSError, sqlite3.Error) as exc:
        raise DatabaseError(f"cannot open the queue database {path}: {exc}") from exc
    conn.row_factory = sqlite3.Row
    setup_sqlite(conn)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        # Statement journals (a savepoint per write of a group commit) and sorts stay in
        # memory: a temp file each is an open, writes and an unlink, on every other launch.
        conn.execute("PRAGMA temp_store=MEMORY")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA busy_timeout=10000")
        migrate(conn)
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise DatabaseError(f"{path} is not a usable queue database: {exc}") from exc
    return conn


def migrate(conn: sqlite3.Connection) -> int:
    """Apply the migrations the file has not had yet; returns the schema version."""
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version > len(MIGRATIONS):
        raise DatabaseError(
            f"the queue database has schema version {version} but this nymph knows only "
            f"{len(MIGRATIONS)}: upgrade nymph or use another --db"
        )
    for index in range(version, len(MIGRATIONS)):
        conn.executescript(
            f"BEGIN IMMEDIATE;\n{MIGRATIONS[index]}\nPRAGMA user_version = {index + 1};\nCOMMIT;"
        )
        log.info("migrated", version=index + 1)
    return len(MIGRATIONS)


def connect_reader(path: Path) -> sqlite3.Connection:
    """A read-only connection to the (already migrated) ``path``, for the thread that opens it."""
    try:
        # a URI, so the path is quoted: "?", "#" or "%" in a file name are not the URI's
        uri = f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro"
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=0.05)
    except sqlite3.Error as exc:
        raise DatabaseError(f"cannot open the queue database {path}: {exc}") from exc
    conn.row_factory = sqlite3.Row
    setup_sqlite(conn)
    conn.execute("PRAGMA busy_timeout=50")  # never stall the loop: a busy read goes to the thread
    return conn


@contextmanager
def transaction(conn: sqlite3.Connection, *, write: bool) -> Iterator[sqlite3.Connection]:
    conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


#: Most writes committed together.
GROUP_MAX = 64


def _run_group(
    conn: sqlite3.Connection, fns: list[Callable[[sqlite3.Connection], Any]]
) -> list[tuple[bool, Any]]:
    """Each of ``fns`` in its own savepoint of one write transaction, then one commit; per
    function ``(True, result)`` or ``(False, exception)`` (its savepoint rolled back). A group
    of one needs no savepoint: its transaction is its own, so a failure rolls it all back."""
    if len(fns) == 1:
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = fns[0](conn)
        except Exception as exc:
            conn.execute("ROLLBACK")
            return [(False, exc)]
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return [(True, result)]
    out: list[tuple[bool, Any]] = []
    conn.execute("BEGIN IMMEDIATE")
    try:
        for fn in fns:
            conn.execute("SAVEPOINT nymph_write")
            try:
                result = fn(conn)
            except Exception as exc:
                conn.execute("ROLLBACK TO nymph_write")
                conn.execute("RELEASE nymph_write")
                out.append((False, exc))
                continue
            conn.execute("RELEASE nymph_write")
            out.append((True, result))
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return out


def _ignore(namespaces: frozenset[str]) -> None:
    """No one follows events yet."""


class Database:
    """The service's connection, owned by one thread; see the module docstring."""

    #: One process owns the file: there are no other replicas to tell.
    relays = False
    #: A write is a call on the database thread, with no round trip to save.
    batches_launches = False

    def __init__(self, *, path: Path) -> None:
        self.path = path
        self._executor: DbThread | None = None
        self._conn: sqlite3.Connection | None = None
        #: The event loop's read-only connection (see read_small).
        self._reader: sqlite3.Connection | None = None
        self._pending: list[tuple[Callable[[sqlite3.Connection], Any], asyncio.Future[Any]]] = []
        self._drainer: asyncio.Task[None] | None = None
        #: Transactions committed, and the writes they carried (group commit; for tests).
        self.commits = 0
        self.grouped_writes = 0
        self.events_written: Callable[[frozenset[str]], None] = _ignore

    async def open(self) -> None:
        self._executor = DbThread(name="nymph-queue-db")
        try:
            self._conn = await self._executor.call(connect, self.path)
        except BaseException:
            self._executor.close()
            self._executor = None
            raise
        self._reader = connect_reader(self.path)

    async def close(self) -> None:
        if self._executor is None:
            return
        if self._drainer is not None and not self._drainer.done():
            with contextlib.suppress(Exception):
                await self._drainer  # the writes already accepted are committed first
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()
        conn, self._conn = self._conn, None
        if conn is not None:
            await self._executor.call(conn.close)
        self._executor.close()
        self._executor = None

    @property
    def describe(self) -> str:
        """Where the state lives, for logs (never a credential)."""
        return str(self.path)

    async def write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` in a ``BEGIN IMMEDIATE`` transaction on the database thread (with the
        writes queued beside it: see group commit above); its result once committed."""
        if self._executor is None or self._conn is None:
            raise DatabaseError("the queue database is not open")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[tuple[T, frozenset[str]]] = loop.create_future()
        self._pending.append((events.collecting(fn), fut))
        if self._drainer is None or self._drainer.done():
            self._drainer = loop.create_task(self._drain(), name="nymph-queue-db-commit")
        result, namespaces = await fut
        if namespaces:
            self.events_written(namespaces)
        return result

    async def _drain(self) -> None:
        """Hand the queued writes to the database thread, a group at a time, until none wait."""
        try:
            while self._pending and self._executor is not None and self._conn is not None:
                group, self._pending = self._pending[:GROUP_MAX], self._pending[GROUP_MAX:]
                conn = self._conn
                fns = [fn for fn, _ in group]
                try:
                    results = await self._executor.call(_run_group, conn, fns)
                except BaseException as exc:  # the transaction as a whole failed (commit, BEGIN)
                    for _, fut in group:
                        if not fut.done():
                            fut.set_exception(exc)
                    if isinstance(exc, asyncio.CancelledError):
                        raise
                    continue
                self.commits += 1
                self.grouped_writes += len(group)
                for (_, fut), (ok, value) in zip(group, results, strict=True):
                    if fut.done():
                        continue
                    if ok:
                        fut.set_result(value)
                    else:
                        fut.set_exception(value)
        finally:
            if self._executor is None or self._conn is None:  # closed meanwhile
                stranded, self._pending = self._pending, []
                for _, fut in stranded:
                    if not fut.done():
                        fut.set_exception(DatabaseError("the queue database is not open"))

    async def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` in one read transaction (a consistent snapshot) on the database thread."""
        return await self._run(fn, write=False)

    async def read_small(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn``, a read of a few rows by index, in one read transaction on the event loop
        (see the module docstring); on the database thread if the file is busy."""
        reader = self._reader
        if reader is None:
            raise DatabaseError("the queue database is not open")
        try:
            with transaction(reader, write=False):
                return fn(reader)
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
        return await self.read(fn)

    async def read_one(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """A one-statement read: a small read (on the event loop) like any other here."""
        return await self.read_small(fn)

    async def seal_events(self, *, wake: bool = False) -> None:
        """Nothing to do: SQLite's one writer gives each event its cursor as it writes it."""

    async def try_singleton(self, key: int, fn: Callable[[sqlite3.Connection], T]) -> tuple[bool, T | None]:
        """One process owns the file: always this one."""
        return True, await self.write(fn)

    def broadcast(self, key: str) -> None:
        """No other replicas to tell."""

    def broadcast_with(self, conn: Conn, keys: Sequence[str]) -> None:
        """No other replicas to tell."""

    async def exclusive(self, key: int, run: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """One process owns the file: it is always the one to run ``run``."""
        await run()

    async def _run(self, fn: Callable[[sqlite3.Connection], T], *, write: bool) -> T:
        if self._executor is None or self._conn is None:
            raise DatabaseError("the queue database is not open")
        conn = self._conn

        def job() -> T:
            with transaction(conn, write=write):
                return fn(conn)

        return await self._executor.call(job)
