"""The namespace event stream: one row per change of an instance, written by the code that makes
the change inside its own transaction (synchronous SQL), and read back in cursor order.

An event is a snapshot of the instance right after the change (state, reason, message, exit
code, attempt, group, node, waiting reason and its kind) with the names of what changed. Its
``seq`` is its cursor, given only to a committed event and above every cursor given before, on
both backends, so a reader that has seen ``seq`` N can never later find a new event at N or
below (nothing is skipped on a reconnect):

* SQLite has one writer at a time, and ``AUTOINCREMENT`` hands out increasing values;
* PostgreSQL runs writes at once, so a write transaction inserts its events without a seq,
  and they get theirs after its commit, from :func:`seal`: one statement that gives every
  committed event still without one the next values of a counter row (``event_marks.clock``),
  in the order the events were inserted. Sealing statements take that row's lock one at a
  time, and each gives values above every earlier one's: a follower that read N never finds a
  new event at N or below. Write transactions never touch the counter, so writes to different
  instances never wait for each other (a counter held by each write until its commit made every
  commit of every replica wait for the one before it). A sequence would not do: a value taken
  by a transaction that commits later can be smaller. Sealing is left to those who read the
  stream: a read that finds events of its namespace unsealed seals them (with whatever else is
  unsealed, one statement shared by the reads that come together) and reads again, so a write
  neither waits for nor pays for its events' cursors; the sweeper seals what nobody read.

Retention removes a prefix (the events older than ``--retention-days``) and raises
``event_marks.floor`` to the last seq removed: a cursor below it is answered with 410.

Which namespaces a write transaction added events to is noted in a context variable while
:func:`collecting` runs it, so the backend can wake the followers after the commit.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from nymph.launch.placement import waiting_kind
from nymph.protocol import EventJSON, iso
from nymph.queue.errors import BadRequest, Gone
from nymph.queue.sql.dialect import Conn, PgConn, Row, is_postgres, send

T = TypeVar("T")
C = TypeVar("C")

#: What an event can say changed.
CREATED, STATE, REASON, EXIT, NODE, WAITING = "created", "state", "reason", "exitCode", "node", "waiting"
ATTEMPT = "attempt"
#: The largest cursor accepted (a signed 64-bit integer).
MAX_CURSOR = 2**63 - 1

_COLUMNS = (
    "seq, namespace, provider, instance_id, launch_group, attempt, changes, state, reason, message, "
    "exit_code, node, waiting, waiting_kind, at"
)
#: The write transaction's tally; a context variable, so that transactions running at once on
#: one thread (PostgreSQL's, each in a greenlet of its own) or on several (SQLite's) keep theirs.
_written: contextvars.ContextVar[_Written | None] = contextvars.ContextVar(
    "nymph_events_written", default=None
)


class _Written:
    """What one write transaction added to the stream so far."""

    def __init__(self) -> None:
        self.namespaces: set[str] = set()


def collecting(fn: Callable[[C], T]) -> Callable[[C], tuple[T, frozenset[str]]]:
    """``fn`` returning also the namespaces it added events to (run on the database thread); on
    PostgreSQL its events get their seqs after the commit (:func:`seal`)."""

    def run(conn: C) -> tuple[T, frozenset[str]]:
        outer = _written.get()
        written = _Written() if outer is None else outer
        token = _written.set(written)
        try:
            result = fn(conn)
            return result, frozenset(written.namespaces)
        finally:
            _written.reset(token)

    return run


#: Gives every committed event without a seq (``t``, read in one snapshot) the next values of
#: the counter, in the order they were inserted; the namespaces it sealed events of. The counter
#: row's lock orders sealing statements: one that waited for another's commit reads the counter
#: that one left (PostgreSQL reads a row updated meanwhile again), and an event that one sealed
#: meanwhile is left alone (``seq IS NULL`` is checked again on the row as it is now), so no
#: value is given twice; such an event leaves a gap in the cursors, which only need to grow.
SEAL = (
    "WITH t AS (SELECT id, row_number() OVER (ORDER BY id) AS n FROM events WHERE seq IS NULL), "
    "k AS (SELECT count(*) AS n FROM t), "
    "c AS (UPDATE event_marks SET clock = event_marks.clock + k.n FROM k "
    "WHERE event_marks.id = 1 AND k.n > 0 RETURNING event_marks.clock - k.n AS base), "
    "u AS (UPDATE events SET seq = c.base + t.n FROM t, c "
    "WHERE events.id = t.id AND events.seq IS NULL RETURNING events.namespace) "
    "SELECT DISTINCT namespace FROM u"
)


def seal(conn: PgConn) -> frozenset[str]:
    """Give the committed events that have no seq yet theirs (:data:`SEAL`, one statement: on
    PostgreSQL it runs alone, its own transaction); the namespaces of the events sealed."""
    return frozenset(str(r[0]) for r in conn.execute(SEAL).fetchall())


def _note(ns: str) -> None:
    written = _written.get()
    if written is not None:
        written.namespaces.add(ns)


def record(
    conn: Conn,
    *,
    instance_id: str,
    changes: Sequence[str],
    at: float,
    standing: tuple[str, str | None] | None = None,
) -> None:
    """Append the event of ``changes`` to ``instance_id`` (read as it is now, after them).
    ``standing``: the waiting reason worked out at read time and its kind (a quota, a share), for
    a queued instance that has no stored one. The kind told is kept on the instance
    (``waiting_told``), so that the sweeper tells only a change of it."""
    row = conn.execute(_SNAPSHOT_OF, (instance_id,)).fetchone()
    if row is None or not changes:
        return
    record_row(conn, instance_id=instance_id, row=row, changes=changes, at=at, standing=standing)


#: What an event is a snapshot of: the instance's columns it copies, and the kind told.
_SNAPSHOT = (
    "namespace, provider, group_id, attempt, state, reason, message, exit_code, node, waiting, waiting_told"
)
_SNAPSHOT_OF = f"SELECT {_SNAPSHOT} FROM instances WHERE instance_id = ?"  # noqa: S608
#: Most instances one statement of :func:`record_each` names (a statement's parameters are
#: bounded, and so is what one read brings back).
EACH_CHUNK = 500


def record_each(
    conn: Conn,
    *,
    instance_ids: Sequence[str],
    changes: Sequence[str],
    at: float,
    standing: Mapping[str, tuple[str, str | None]] | None = None,
) -> None:
    """:func:`record` of the same ``changes`` to many instances, in the order given (an id given
    twice is recorded once; one no longer there, not at all): their rows are read with one
    statement per :data:`EACH_CHUNK`, their events sent together, and the kinds told kept with
    one statement per kind. The sweeper gives hundreds of queued launches a waiting reason at
    once: on a database a network round trip away, that is a few round trips, not a few per
    launch. ``standing``: :func:`record`'s, by instance id."""
    ids = list(dict.fromkeys(instance_ids))
    if not ids or not changes:
        return
    told: dict[str | None, list[str]] = {}
    for start in range(0, len(ids), EACH_CHUNK):
        chunk = ids[start : start + EACH_CHUNK]
        marks = ",".join("?" * len(chunk))
        rows = conn.execute(
            f"SELECT instance_id, {_SNAPSHOT} FROM instances WHERE instance_id IN ({marks})",  # noqa: S608
            chunk,
        ).fetchall()
        by_id = {str(r["instance_id"]): r for r in rows}
        for instance_id in chunk:
            row = by_id.get(instance_id)
            if row is None:
                continue
            tell, kind = _send_event(
                conn,
                instance_id=instance_id,
                row=row,
                changes=changes,
                at=at,
                standing=None if standing is None else standing.get(instance_id),
            )
            if tell:
                told.setdefault(kind, []).append(instance_id)
    for kind, group in told.items():
        for start in range(0, len(group), EACH_CHUNK):
            chunk = group[start : start + EACH_CHUNK]
            send(
                conn,
                f"UPDATE instances SET waiting_told = ? WHERE instance_id IN ({','.join('?' * len(chunk))})",  # noqa: S608
                (kind, *chunk),
            )


def record_row(
    conn: Conn,
    *,
    instance_id: str,
    row: Row | Mapping[str, Any],
    changes: Sequence[str],
    at: float,
    standing: tuple[str, str | None] | None = None,
) -> None:
    """:func:`record` from ``row``, the instance as it is now (its namespace, provider,
    group_id, attempt, state, reason, message, exit_code, node, waiting and waiting_told), for
    a caller that has just written them and need not read them back."""
    if not changes:
        return
    tell, kind = _send_event(
        conn, instance_id=instance_id, row=row, changes=changes, at=at, standing=standing
    )
    if tell:
        send(conn, "UPDATE instances SET waiting_told = ? WHERE instance_id = ?", (kind, instance_id))


def _send_event(
    conn: Conn,
    *,
    instance_id: str,
    row: Row | Mapping[str, Any],
    changes: Sequence[str],
    at: float,
    standing: tuple[str, str | None] | None,
) -> tuple[bool, str | None]:
    """Send the event's row (its result unread); whether the instance is now told another
    waiting kind (``waiting_told``), and that kind."""
    waiting = row["waiting"] if row["state"] == "queued" else None
    kind = waiting_kind(waiting)
    if waiting is None and standing is not None and row["state"] == "queued":
        waiting, kind = standing
    send(
        conn,
        f"INSERT INTO events ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",  # noqa: S608
        (
            None,
            row["namespace"],
            row["provider"],
            instance_id,
            row["group_id"],
            row["attempt"],
            ",".join(changes),
            row["state"],
            row["reason"],
            row["message"] or "",
            row["exit_code"],
            row["node"],
            waiting,
            kind,
            at,
        ),
    )
    _note(str(row["namespace"]))
    return row["state"] == "queued" and row["waiting_told"] != kind, kind


def record_created(
    conn: Conn, *, ns: str, provider: str, group: str | None, instance_ids: Sequence[str], at: float
) -> None:
    """The creation events of new queued instances (first attempts, as inserted: no reason, node
    or exit code yet), of a launch group in its order or of no group, written without reading
    them back."""
    if not instance_ids:
        return
    sql = f"INSERT INTO events ({_COLUMNS}) VALUES (NULL, ?, ?, ?, ?, 1, ?, 'queued', NULL, '', NULL, NULL, NULL, NULL, ?)"  # noqa: S608
    rows = [(ns, provider, iid, group, f"{CREATED},{STATE}", at) for iid in instance_ids]
    if len(rows) == 1:
        send(conn, sql, rows[0])
    else:
        conn.executemany(sql, rows)
    _note(ns)


def changes_between(
    before: tuple[str, str | None, str | None], after: tuple[str, str | None, str | None]
) -> list[str]:
    """What an event says changed from ``(state, reason, node)`` before to after."""
    return [name for name, a, b in zip((STATE, REASON, NODE), before, after, strict=True) if a != b]


# --- reading ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class EventFilter:
    """Which events of a namespace: all, or those of one provider, group or instance."""

    provider: str | None = None
    group: str | None = None
    instance: str | None = None


@dataclass(frozen=True)
class EventPage:
    """Events after a cursor, oldest first, and the cursor to read on from (``next_cursor``: the
    last one read, or when the page is not full the newest event of the whole queue, so that a
    reader of a quiet filter does not read the same stretch again). ``unsealed``: the namespace
    has committed events without a seq yet (PostgreSQL), which this page cannot show: seal them
    (:func:`seal`) and read again."""

    items: list[EventJSON]
    next_cursor: int
    full: bool
    unsealed: bool = False


def parse_cursor(raw: str | None, *, name: str = "after") -> int | None:
    """A cursor from a query (``after``) or a ``Last-Event-ID``; BadRequest for anything else."""
    if raw is None or raw == "":
        return None
    if not raw.isascii() or not raw.isdigit() or len(raw) > 19 or int(raw) > MAX_CURSOR:
        raise BadRequest(
            f"{name}={raw[:40]!r} is not an event cursor: give an event's cursor or a continue value",
            code="invalid_cursor",
        )
    return int(raw)


def _marks(conn: Conn, ns: str) -> tuple[int, bool]:
    """The floor, and whether ``ns`` has events not sealed yet (PostgreSQL only; one statement)."""
    if is_postgres(conn):
        row = conn.execute(
            "SELECT floor, EXISTS (SELECT 1 FROM events WHERE seq IS NULL AND namespace = ?) "
            "FROM event_marks WHERE id = 1",
            (ns,),
        ).fetchone()
        return (0, False) if row is None else (int(row[0]), bool(row[1]))
    row = conn.execute("SELECT floor FROM event_marks WHERE id = 1").fetchone()
    return 0 if row is None else int(row[0]), False


def event_json(r: Row) -> EventJSON:
    return EventJSON(
        cursor=str(r["seq"]),
        at=iso(r["at"]),
        namespace=r["namespace"],
        providerName=r["provider"],
        instanceId=r["instance_id"],
        changes=str(r["changes"]).split(","),
        state=r["state"],
        reason=r["reason"],
        message=r["message"],
        exitCode=None if r["exit_code"] is None else int(r["exit_code"]),
        attempt=None if r["attempt"] is None else int(r["attempt"]),
        group=r["launch_group"],
        node=r["node"],
        waiting=r["waiting"],
        waitingKind=r["waiting_kind"],
    )


def read(conn: Conn, *, ns: str, after: int | None, limit: int, where: EventFilter) -> EventPage:
    """At most ``limit`` events of ``ns`` after the cursor ``after`` (None: the oldest kept);
    Gone when events after ``after`` were removed by retention."""
    floor, unsealed = _marks(conn, ns)
    if after is not None and after < floor:
        raise Gone(
            f"events up to cursor {floor} are gone (older than the queue keeps them, --retention-days): "
            f"cursor {after} is before them; read again without after to start at the oldest kept",
            code="cursor_expired",
        )
    start = floor if after is None else after
    sql = f"SELECT {_COLUMNS} FROM events WHERE namespace = ? AND seq > ?"  # noqa: S608
    params: list[object] = [ns, start]
    for column, value in (
        ("provider", where.provider),
        ("launch_group", where.group),
        ("instance_id", where.instance),
    ):
        if value is not None:
            sql += f" AND {column} = ?"
            params.append(value)
    rows = conn.execute(sql + " ORDER BY seq LIMIT ?", [*params, limit + 1]).fetchall()
    if len(rows) > limit:
        kept = rows[:limit]
        return EventPage(
            items=[event_json(r) for r in kept],
            next_cursor=int(kept[-1]["seq"]),
            full=True,
            unsealed=unsealed,
        )
    newest = conn.execute("SELECT MAX(seq) FROM events").fetchone()[0]
    return EventPage(
        items=[event_json(r) for r in rows],
        next_cursor=max(start, 0 if newest is None else int(newest)),
        full=False,
        unsealed=unsealed,
    )


# --- retention -------------------------------------------------------------------------------


def prune(conn: Conn, *, before: float, limit: int) -> int:
    """Remove the oldest events up to the first one at or after ``before`` (at most ``limit``),
    raising the floor to the last seq removed; returns how many went. Events not sealed yet
    (PostgreSQL) wait for their seq: the sweeper seals them."""
    rows = conn.execute(
        "SELECT seq, at FROM events WHERE seq IS NOT NULL ORDER BY seq LIMIT ?", (limit,)
    ).fetchall()
    cut: int | None = None
    for r in rows:
        if float(r["at"]) >= before:
            break
        cut = int(r["seq"])
    if cut is None:
        return 0
    cur = conn.execute("DELETE FROM events WHERE seq <= ?", (cut,))
    conn.execute("UPDATE event_marks SET floor = GREATEST(floor, ?) WHERE id = 1", (cut,))
    return int(cur.rowcount or 0)
