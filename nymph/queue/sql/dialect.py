"""The one place the SQL modules meet the difference between SQLite and PostgreSQL.

The SQL in :mod:`nymph.queue.sql` is written once, in the subset both speak, with SQLite's
``?`` (positional) and ``:name`` (named) placeholders; a connection is anything with
``execute(sql, params)`` (:class:`Conn`): a ``sqlite3.Connection`` as it is, or a
:class:`PgConn` that translates the placeholders for psycopg and returns rows readable by index
and by column name (like ``sqlite3.Row``). Scalar ``GREATEST(a, b)`` is registered on SQLite
connections. The few statements that must differ ask :func:`is_postgres` (row locks: ``FOR
UPDATE``, ``SKIP LOCKED``). The schema itself is per backend (:mod:`.migrations`,
:mod:`.pg_migrations`).

Locks: a SQLite write transaction holds the whole database, so the helpers below add nothing
there. On PostgreSQL write transactions run at once (``READ COMMITTED``, see
:mod:`nymph.queue.pgdb`), and a write that reads a row and then decides what to write locks
what it read: :func:`for_update` (a row), :func:`lock_key` (a name no row stands for yet, as a
daemon id or a namespace). Read transactions (``READ ONLY``) take no lock.
"""

from __future__ import annotations

import functools
import re
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import psycopg


class Row(Protocol):
    def __getitem__(self, key: int | str, /) -> Any: ...


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Conn(Protocol):
    def execute(self, sql: str, parameters: Any = ..., /) -> Cursor: ...

    def executemany(self, sql: str, seq_of_parameters: Any, /) -> Cursor: ...


def is_postgres(conn: Conn) -> bool:
    return isinstance(conn, PgConn)


def locks_rows(conn: Conn) -> bool:
    """Whether this transaction must lock what it reads before writing (a PostgreSQL write)."""
    return isinstance(conn, PgConn) and conn.writing


def for_update(conn: Conn, *, of: str = "", skip_locked: bool = False, key: bool = True) -> str:
    """`` FOR UPDATE [OF x] [SKIP LOCKED]`` in a PostgreSQL write transaction (``key=False``:
    ``FOR NO KEY UPDATE``, which rows referencing the locked one may still be inserted beside);
    empty on SQLite (a write transaction there holds the whole database) and in reads."""
    if not locks_rows(conn):
        return ""
    mode = " FOR UPDATE" if key else " FOR NO KEY UPDATE"
    return mode + (f" OF {of}" if of else "") + (" SKIP LOCKED" if skip_locked else "")


#: Unique constraints a PostgreSQL write may break on purpose, by name: what to answer (a 409's
#: message and code) when it broke it on every attempt (see :data:`nymph.queue.pgdb.WRITE_ATTEMPTS`).
#: A write that sends an insert without waiting for its answer (:func:`send`) learns of a taken
#: key only at its commit; it is then run again from its start, with fresh keys.
UNIQUE_CONFLICTS: dict[str, tuple[str, str]] = {}

#: Advisory lock classes of :func:`lock_key` (the second key is the hash of the name).
NAMESPACE_KEYS = 0x6E796D70  # "nymp": a namespace's scheduling (claims, quota, direct launches)
DAEMON_KEYS = 0x6E796D71  # a daemon id's sessions


def lock_key(conn: Conn, cls: int, name: str) -> None:
    """Hold the transaction-scoped advisory lock (``cls``, hash of ``name``) until the write
    commits, in a PostgreSQL write transaction; nothing on SQLite. Take several in name order
    (no deadlock)."""
    if locks_rows(conn):
        conn.execute("SELECT pg_advisory_xact_lock(?, hashtext(?))", (cls, name))


def indexed_by(conn: Conn, index: str) -> str:
    """`` INDEXED BY index`` on SQLite, whose planner (with no table statistics) would otherwise
    read a large backlog through a wider index; empty on PostgreSQL, which plans from its own
    statistics."""
    return "" if is_postgres(conn) else f" INDEXED BY {index}"


def setup_sqlite(conn: sqlite3.Connection) -> None:
    """Give a SQLite connection what the shared SQL uses beyond SQLite's own functions."""
    conn.create_function("GREATEST", 2, _greatest, deterministic=True)


def _greatest(a: Any, b: Any) -> Any:
    if a is None or b is None:
        return a if b is None else b
    return a if a >= b else b


# --- PostgreSQL -----------------------------------------------------------------------------

_TOKEN = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|\?|:[A-Za-z_][A-Za-z0-9_]*|%|::")


@functools.lru_cache(maxsize=2048)
def translate(sql: str) -> str:
    """SQLite placeholders -> psycopg ones: ``?`` -> ``%s``, ``:name`` -> ``%(name)s``, every
    ``%`` doubled; ``?`` and ``:name`` inside quoted strings and identifiers are left alone."""

    def sub(m: re.Match[str]) -> str:
        tok = m.group(0)
        if tok == "?":
            return "%s"
        if tok == "%":
            return "%%"
        if tok.startswith(":") and tok != "::":
            return f"%({tok[1:]})s"
        return tok.replace("%", "%%")  # a quoted string or identifier: psycopg still reads its %

    return _TOKEN.sub(sub, sql)


_NO_COLUMNS: Mapping[str, int] = {}


@functools.lru_cache(maxsize=1024)
def _column_index(names: tuple[bytes | None, ...]) -> Mapping[str, int]:
    """Each column's position by its name (of two alike, the last). The queue's statements
    name their columns in ASCII, which every client encoding PostgreSQL offers spells the
    same."""
    return {(name or b"").decode("ascii", "replace"): i for i, name in enumerate(names)}


class PgRow(tuple[Any, ...]):
    """A row readable by position and by column name, like ``sqlite3.Row``."""

    _index: Mapping[str, int]

    def __new__(cls, values: Sequence[Any], index: Mapping[str, int]) -> PgRow:
        row = super().__new__(cls, values)
        row._index = index
        return row

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return super().__getitem__(self._index[key])
        return super().__getitem__(key)

    def keys(self) -> list[str]:
        return list(self._index)


def pg_row_factory(cursor: Any) -> Any:
    # The column names read from the result itself (``cursor.description`` makes a Column
    # object per column for every statement), each set of names indexed once.
    result = cursor.pgresult
    if result is None or not result.nfields:
        index: Mapping[str, int] = _NO_COLUMNS
    else:
        index = _column_index(tuple(result.fname(i) for i in range(result.nfields)))

    def make(values: Sequence[Any]) -> PgRow:
        return PgRow(values, index)

    return make


class PgConn:
    """A psycopg connection speaking the shared SQL (see the module docstring); ``writing``: in
    a write transaction (which locks what it reads before writing), not a read-only one."""

    def __init__(
        self,
        raw: psycopg.Connection[Any],
        *,
        writing: bool = True,
        single: bool = False,
        begin: str | None = None,
    ) -> None:
        self.raw = raw
        self.writing = writing
        #: A ``READ COMMITTED`` write's ``BEGIN``, sent only when the write needs it (see
        #: :meth:`_begin_if_needed`); None: the caller began the transaction, or there is none.
        self._begin = begin
        #: Outside a transaction (autocommit): one statement only, the next one is refused.
        self._statements_left = 1 if single else -1
        #: Whether the ``COMMIT`` was sent (after that, a lost connection leaves it unknown).
        self.commit_sent = False
        #: Statements whose results are not read, not sent yet (see :meth:`send`).
        self._queued: list[tuple[str, Any]] = []
        #: How many times queued statements were sent (see :meth:`mark`).
        self._flushes = 0
        #: ``pg_notify`` arguments to send with the commit (see :meth:`tell`).
        self._told: list[str] = []

    def send(self, sql: str, parameters: Any = (), /) -> None:
        """Run ``sql``, whose result nobody reads, in the same round trip as the next statement
        (or the ``COMMIT``): in order, so the next one sees what it wrote, and an error it
        meets is raised by that next statement, in the same transaction."""
        self._in_transaction()
        self._queued.append((sql, parameters))

    def tell(self, channel: str, payload: str) -> None:
        """``pg_notify(channel, payload)`` with the commit: in the statement that carries the
        write's rows when it is one (no statement of its own), heard by the listeners once the
        write is committed and never if it is not."""
        self._in_transaction()
        self._told += (channel, payload)

    def _notify_sql(self) -> tuple[str, list[str]]:
        told, self._told = self._told, []
        return "SELECT " + ", ".join(["pg_notify(?, ?)"] * (len(told) // 2)), told

    def mark(self) -> tuple[int, int]:
        """Where what :meth:`send` queued ends now: :meth:`undo` drops what is queued after it."""
        return len(self._queued), self._flushes

    def undo(self, mark: tuple[int, int]) -> bool:
        """Drop the statements :meth:`send` queued since ``mark``, if none of them was sent to
        the server yet (no statement ran since): whether it could."""
        queued, flushes = mark
        if flushes != self._flushes or len(self._queued) < queued:
            return False
        del self._queued[queued:]
        return True

    def commit(self) -> None:
        """``COMMIT``, in one round trip with the statements :meth:`send` queued. A write that has not begun its transaction (it only read, each
        read its own snapshot) and whose writes make one statement (:func:`_merged`) sends that
        statement alone: one statement is atomic by itself, and no ``BEGIN`` or ``COMMIT`` is
        needed; nothing at all when it wrote nothing."""
        if self._begin is not None:
            statements = list(_merged(self._queued))
            # (notifies join only rows: another statement in a WITH may not run at all)
            joins = not self._told or all(_plain_insert(sqls[0]) is not None for sqls, _ in statements)
            if len(statements) <= 1 and joins:
                self._queued = []
                self._flushes += 1
                self._begin = None
                sqls, parameters = statements[0] if statements else ((), [])
                if self._told:
                    # the notifies as the statement's own query, its rows as its WITH parts
                    notify, told = self._notify_sql()
                    sqls, parameters = (*sqls, notify), [*parameters, *told]
                if sqls:
                    self.commit_sent = True
                    self._execute_merged(sqls, parameters)
                return
            self._begin_now()
        if self._told:
            self._queued.append(self._notify_sql())
        self.commit_sent = True
        if not self._queued:
            self.raw.execute("COMMIT")
            return
        with self.raw.pipeline():
            self._run_queued()
            self.raw.execute("COMMIT")

    def flush(self) -> None:
        """Run what :meth:`send` left, without committing (a transaction committed by its
        caller)."""
        if self._begin is not None and self._queued:
            self._begin_now()
        if self._queued:
            with self.raw.pipeline():
                self._run_queued()

    def _run_queued(self) -> None:
        queued, self._queued = self._queued, []
        self._flushes += 1
        for sqls, parameters in _merged(queued):
            self._execute_merged(sqls, parameters)

    def _execute_merged(self, sqls: tuple[str, ...], parameters: Any) -> None:
        """One statement of :func:`_merged`. One with many parameters (the rows of a batch) is
        sent with PostgreSQL's own placeholders (:func:`_native`), which psycopg does not parse:
        it parses a statement's ``%s`` again each time once it has more than a few dozen
        parameters, and the rows of a batch have hundreds."""
        if isinstance(parameters, Mapping) or len(parameters) <= PARSED_PARAMETERS:
            self.raw.execute(_with(sqls), parameters)
        else:
            from psycopg import RawCursor  # (PostgreSQL's driver: loaded with the connection)

            RawCursor(self.raw).execute(_native(sqls), parameters)

    def _begin_if_needed(self, sql: str) -> None:
        """Begin the transaction before ``sql`` unless it is a plain read with nothing written
        before it. Each statement of a ``READ COMMITTED`` transaction reads what was committed
        when it started, as a statement of its own does; a plain read locks nothing, so it
        needs no transaction. A write, a read that locks (a row, an advisory lock) and every
        read after a write run in the transaction."""
        if self._begin is not None and (self._queued or not _plain_read(sql)):
            self._begin_now()

    def _begin_now(self) -> None:
        assert self._begin is not None
        self._queued.insert(0, (self._begin, ()))
        self._begin = None

    def _in_transaction(self) -> None:
        if self._statements_left >= 0:
            raise RuntimeError("a one-statement read cannot write: use a write transaction")

    def _spend(self, statements: int) -> None:
        if self._statements_left >= 0:
            if statements > self._statements_left:
                raise RuntimeError("a one-statement read ran a second statement: use a read transaction")
            self._statements_left -= statements

    def execute(self, sql: str, parameters: Any = (), /) -> Cursor:
        self._spend(1)
        self._begin_if_needed(sql)
        if not self._queued:
            cur: Cursor = self.raw.execute(translate(sql), _params(parameters))
            return cur
        with self.raw.pipeline():
            self._run_queued()
            cur = self.raw.execute(translate(sql), _params(parameters))
        return cur

    def executemany(self, sql: str, seq_of_parameters: Any, /) -> Cursor:
        """One statement over many rows (a bulk insert): psycopg pipelines them."""
        self._in_transaction()
        if self._begin is not None:
            self._begin_now()
        if self._queued:
            with self.raw.pipeline():
                self._run_queued()
        cur = self.raw.cursor()
        cur.executemany(translate(sql), [[_text(v) for v in params] for params in seq_of_parameters])
        out: Cursor = cur
        return out


#: PostgreSQL's limit on one statement's parameters: a run that would pass it is cut there.
MAX_PARAMETERS = 65535


def _merged(queued: Sequence[tuple[str, Any]]) -> Iterator[tuple[tuple[str, ...], Any]]:
    """The statements :meth:`PgConn.send` queued, in order, as few statements as they can be
    without changing what they do: a run of plain ``INSERT ... VALUES`` becomes one statement
    (:func:`_with`), which PostgreSQL runs at once, its foreign keys checked at its end; what
    one statement writes is never read by another of its run. Rows for one table go in one
    ``INSERT`` of many rows, in the order they were sent (a table's rows keep their order, as
    its serial ids do): the same ``INSERT`` sent for many launches of a batch is one part of one
    statement, not a statement each. Another ``INSERT`` into a table already in the run (other
    columns) ends the run. Every other statement goes as it is."""
    parts: dict[str, tuple[str, list[int], list[Any]]] = {}  # table -> (its INSERT, [rows], values)
    count = 0
    for sql, parameters in queued:
        table = _plain_insert(sql) if not isinstance(parameters, Mapping) else None
        own = _params(parameters)
        if parts:
            part = parts.get(table) if table is not None else None
            other_columns = part is not None and part[0] != sql
            if table is None or other_columns or count + len(own) > MAX_PARAMETERS:
                yield _run(parts)
                parts, count = {}, 0
        if table is None:
            yield (sql,), own
            continue
        sql_rows_values = parts.setdefault(table, (sql, [0], []))
        sql_rows_values[1][0] += 1
        sql_rows_values[2].extend(own)
        count += len(own)
    if parts:
        yield _run(parts)


def _run(parts: Mapping[str, tuple[str, list[int], list[Any]]]) -> tuple[tuple[str, ...], list[Any]]:
    sqls = tuple(_rows(sql, rows) for sql, (rows,), _ in parts.values())
    return sqls, [v for _, _, values in parts.values() for v in values]


@functools.lru_cache(maxsize=512)
def _rows(sql: str, rows: int) -> str:
    """The plain ``INSERT ... VALUES (...)`` ``sql`` for ``rows`` rows."""
    if rows == 1:
        return sql
    m = _INSERT.match(sql)
    assert m is not None  # a plain insert (see _plain_insert)
    one = sql[m.end() - 1 :].strip()
    return sql.rstrip() + (", " + one) * (rows - 1)


_LOCKS = re.compile(
    r"\b(?:FOR\s+(?:UPDATE|SHARE|NO\s+KEY|KEY\s+SHARE)|INSERT|UPDATE|DELETE|MERGE|NEXTVAL|SETVAL)\b|ADVISORY|NOTIFY",
    re.IGNORECASE,
)


@functools.lru_cache(maxsize=1024)
def _plain_read(sql: str) -> bool:
    """Whether ``sql`` is a ``SELECT`` that writes and locks nothing."""
    return sql.lstrip()[:6].upper() == "SELECT" and _LOCKS.search(sql) is None


_INSERT = re.compile(r"\s*INSERT\s+INTO\s+([A-Za-z_][A-Za-z0-9_]*)\s*\([^()]*\)\s*VALUES\s*\(", re.IGNORECASE)


@functools.lru_cache(maxsize=256)
def _plain_insert(sql: str) -> str | None:
    """The table a plain ``INSERT INTO t (...) VALUES (...)`` (no ``SELECT``, ``RETURNING`` or
    conflict clause) writes to; None for any other statement."""
    m = _INSERT.match(sql)
    upper = sql.upper()
    if m is None or any(k in upper for k in ("SELECT", "RETURNING", "CONFLICT", ";", "WITH")):
        return None
    return m.group(1).lower()


@functools.lru_cache(maxsize=256)
def _with(sqls: tuple[str, ...]) -> str:
    """One statement of ``sqls`` (see :func:`_merged`): all but the last as ``WITH`` parts."""
    *first, last = sqls
    if not first:
        return translate(last)
    parts = ", ".join(f"w{i} AS ({translate(sql)})" for i, sql in enumerate(first))
    return f"WITH {parts} {translate(last)}"


#: The most parameters a statement has for psycopg to keep its parsed form (psycopg's own
#: limit); one with more goes with native placeholders (:meth:`PgConn._execute_merged`).
PARSED_PARAMETERS = 50


@functools.lru_cache(maxsize=512)
def _native(sqls: tuple[str, ...]) -> str:
    """:func:`_with`'s statement with PostgreSQL's placeholders (``$1``, ``$2``...) for the
    ``?`` of ``sqls``, in order; quoted strings and identifiers left alone, ``%`` kept as it is."""
    count = 0

    def sub(m: re.Match[str]) -> str:
        nonlocal count
        if m.group(0) != "?":
            return m.group(0)
        count += 1
        return f"${count}"

    *first, last = sqls
    parts = ", ".join(f"w{i} AS ({sql})" for i, sql in enumerate(first))
    return _TOKEN.sub(sub, f"WITH {parts} {last}" if first else last)


def _params(parameters: Any) -> Any:
    if isinstance(parameters, Mapping):
        return {k: _text(v) for k, v in parameters.items()}
    return [_text(v) for v in parameters]


def send(conn: Conn, sql: str, parameters: Any = (), /) -> None:
    """Run ``sql``, whose result the caller does not read: on PostgreSQL in the same round trip
    as the next statement (:meth:`PgConn.send`), on SQLite at once."""
    if isinstance(conn, PgConn):
        conn.send(sql, parameters)
    else:
        conn.execute(sql, parameters)


def _text(value: Any) -> Any:
    """PostgreSQL text cannot hold NUL: stored as U+FFFD (the same on every write and lookup, so
    a key with a NUL separator still matches itself)."""
    return value.replace("\x00", "\ufffd") if isinstance(value, str) and "\x00" in value else value
