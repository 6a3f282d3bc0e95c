"""An instance's log as offset-keyed chunks: append (idempotent, capped), read, retention.

Synchronous SQL inside one transaction on the database thread. Offsets are bytes of the log as
the job printed it (see :mod:`nymph.launch.logcap`): a chunk that overlaps what is stored is
cut to its new part, a repeated one changes nothing, and one that starts after the log's end
is refused (a gap would make every later offset wrong).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nymph.launch.logcap import Dropped, Piece, keep_outside, overlap_skip, plan_drop, read_from
from nymph.queue.errors import Conflict, NotFound, ServiceError
from nymph.queue.models import DaemonSession
from nymph.queue.sql import binding
from nymph.queue.sql.dialect import Conn, for_update
from nymph.queue.sql.rows import fetch_instance, lock_instance, session_may_act

#: Rows read per :func:`read` (chunks are at most a few hundred KiB each).
READ_ROWS = 16


@dataclass(frozen=True)
class LogStatus:
    """What a reader needs besides the bytes: how far the log goes and whether it is over."""

    total: int = 0
    dropped: Dropped = field(default_factory=Dropped)
    complete: bool = False
    cursor: str | None = None
    note: str | None = None
    updated_at: float | None = None

    @property
    def whole(self) -> bool:
        """Whether the log is stored to its end and has output: readers get it, never a tail
        kept besides (a tail is kept only for a log with no stored bytes)."""
        return self.complete and self.total > 0


@dataclass(frozen=True)
class LogRead:
    data: bytes
    #: The offset after what ``data`` covers (where the next read starts).
    next_offset: int
    status: LogStatus


def status(conn: Conn, *, instance_id: str) -> LogStatus | None:
    row = conn.execute("SELECT * FROM log_streams WHERE instance_id = ?", (instance_id,)).fetchone()
    if row is None:
        return None
    return LogStatus(
        total=int(row["total"]),
        dropped=Dropped(int(row["dropped_start"]), int(row["dropped_end"])),
        complete=bool(row["complete"]),
        cursor=row["cursor"],
        note=row["note"],
        updated_at=float(row["updated_at"]),
    )


def append(
    conn: Conn,
    *,
    instance_id: str,
    offset: int,
    data: bytes,
    cap: int,
    now: float,
    cursor: str | None = None,
    final: bool = False,
    note: str | None = None,
) -> LogStatus:
    """Add ``data`` at ``offset`` (its part not yet stored), then drop the oldest middle part
    beyond ``cap``; ``final`` marks the log complete. Returns the log's status after it."""
    lock_instance(conn, instance_id)  # the log's status is read, then written
    st = status(conn, instance_id=instance_id) or LogStatus()
    if st.complete:
        return st  # a complete log never changes (a late repeat of its last chunk)
    skip = overlap_skip(total=st.total, offset=offset, size=len(data))
    if skip is None:
        raise Conflict(
            f"log chunk at offset {offset} of {instance_id!r} leaves a gap: the log has {st.total} bytes",
            code="log_gap",
        )
    new = data[skip:]
    total = st.total + len(new)
    if new:
        conn.execute(
            "INSERT INTO log_chunks (instance_id, start, data) VALUES (?, ?, ?)",
            (instance_id, st.total, new),
        )
    dropped = plan_drop(total=total, dropped=st.dropped, cap=cap)
    if dropped != st.dropped:
        _drop(conn, instance_id=instance_id, dropped=dropped)
    conn.execute(
        "INSERT INTO log_streams (instance_id, total, dropped_start, dropped_end, cursor, complete, note, "
        "updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (instance_id) DO UPDATE SET "
        "total = excluded.total, dropped_start = excluded.dropped_start, "
        "dropped_end = excluded.dropped_end, cursor = COALESCE(excluded.cursor, log_streams.cursor), "
        "complete = excluded.complete, note = COALESCE(excluded.note, log_streams.note), "
        "updated_at = excluded.updated_at",
        (instance_id, total, dropped.start, dropped.end, cursor, int(final), note, now),
    )
    return LogStatus(
        total=total,
        dropped=dropped,
        complete=final,
        cursor=cursor if cursor is not None else st.cursor,
        note=note if note is not None else st.note,
        updated_at=now,
    )


def _drop(conn: Conn, *, instance_id: str, dropped: Dropped) -> None:
    """Remove the stored bytes inside ``dropped`` (whole chunks, and the cut ends of two)."""
    rows = conn.execute(
        "SELECT start, data FROM log_chunks WHERE instance_id = ? AND start < ? "
        "AND start + length(data) > ? ORDER BY start",
        (instance_id, dropped.end, dropped.start),
    ).fetchall()
    for row in rows:
        piece = Piece(int(row["start"]), bytes(row["data"]))
        conn.execute(
            "DELETE FROM log_chunks WHERE instance_id = ? AND start = ?", (instance_id, piece.offset)
        )
        for kept in keep_outside(piece, dropped):
            conn.execute(
                "INSERT INTO log_chunks (instance_id, start, data) VALUES (?, ?, ?)",
                (instance_id, kept.offset, kept.data),
            )


def read(conn: Conn, *, instance_id: str, since: int, rows: int = READ_ROWS) -> LogRead:
    """Up to ``rows`` chunks of the log from ``since`` on (with the marker where bytes were
    dropped) and where the next read starts."""
    st = status(conn, instance_id=instance_id) or LogStatus()
    since = max(0, since)
    first = conn.execute(
        "SELECT start FROM log_chunks WHERE instance_id = ? AND start <= ? ORDER BY start DESC LIMIT 1",
        (instance_id, since),
    ).fetchone()
    lowest = int(first["start"]) if first is not None else since
    found = conn.execute(
        "SELECT start, data FROM log_chunks WHERE instance_id = ? AND start >= ? ORDER BY start LIMIT ?",
        (instance_id, lowest, rows),
    ).fetchall()
    pieces = [Piece(int(r["start"]), bytes(r["data"])) for r in found]
    data = b"".join(read_from(pieces, since=since, dropped=st.dropped))
    next_offset = max([since, *(p.end for p in pieces)])
    return LogRead(data=data, next_offset=next_offset, status=st)


def read_all(conn: Conn, *, instance_id: str, since: int = 0) -> LogRead | None:
    """The whole stored log from ``since`` (None when the instance has no log stream)."""
    st = status(conn, instance_id=instance_id)
    if st is None:
        return None
    pieces = [
        Piece(int(r["start"]), bytes(r["data"]))
        for r in conn.execute(
            "SELECT start, data FROM log_chunks WHERE instance_id = ? ORDER BY start", (instance_id,)
        )
    ]
    data = b"".join(read_from(pieces, since=max(0, since), dropped=st.dropped))
    return LogRead(data=data, next_offset=max(since, st.total), status=st)


def daemon_append(
    conn: Conn,
    *,
    session: DaemonSession,
    instance_id: str,
    offset: int,
    data: bytes,
    cap: int,
    now: float,
    cursor: str | None,
    final: bool,
    note: str | None,
) -> LogStatus:
    """:func:`append` for a daemon session: only for an instance it may act on."""
    inst = fetch_instance(conn, instance_id)
    if inst is None or not session_may_act(session, inst):
        raise NotFound(
            f"no instance {instance_id!r}: ship logs only for instances you run", code="instance_not_found"
        )
    binding.check_writer(conn, session=session, inst=inst, action="a log chunk")
    return append(
        conn,
        instance_id=instance_id,
        offset=offset,
        data=data,
        cap=cap,
        now=now,
        cursor=cursor,
        final=final,
        note=note,
    )


@dataclass(frozen=True)
class DaemonChunk:
    """One log chunk a daemon ships (the body of ``POST /v1/dispatch/logchunks``)."""

    instance_id: str
    offset: int
    data: bytes
    cursor: str | None = None
    final: bool = False
    note: str | None = None


_SAVEPOINT = "nymph_logchunk"


def daemon_append_many(
    conn: Conn, *, session: DaemonSession, chunks: list[DaemonChunk], cap: int, now: float
) -> list[LogStatus | ServiceError]:
    """:func:`daemon_append` for each of ``chunks``, in order, each in its own savepoint: one
    the queue refuses (404, 403 ``not_instance_daemon``, 409 ``log_gap``) is rolled back alone
    and answered with its refusal, the others go on."""
    out: list[LogStatus | ServiceError] = []
    for c in chunks:
        conn.execute(f"SAVEPOINT {_SAVEPOINT}")
        try:
            st = daemon_append(
                conn,
                session=session,
                instance_id=c.instance_id,
                offset=c.offset,
                data=c.data,
                cap=cap,
                now=now,
                cursor=c.cursor,
                final=c.final,
                note=c.note,
            )
        except ServiceError as exc:
            conn.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
            conn.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}")
            out.append(exc)
            continue
        conn.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}")
        out.append(st)
    return out


_OUTPUT_TABLES = ("log_chunks", "log_streams", "instance_logs", "result_files", "result_chunks")


def purge(conn: Conn, *, stopped_before: float, limit: int = 200) -> list[str]:
    """Remove the logs and results of instances stopped before ``stopped_before`` (retention);
    returns the instance ids purged (at most ``limit`` per call)."""
    ids = [
        r[0]
        for r in conn.execute(
            "SELECT i.instance_id FROM instances i WHERE i.state = 'stopped' AND i.updated_at < ? AND ("  # noqa: S608 - constants only
            "EXISTS (SELECT 1 FROM log_streams s WHERE s.instance_id = i.instance_id) OR "
            "EXISTS (SELECT 1 FROM instance_logs l WHERE l.instance_id = i.instance_id) OR "
            "EXISTS (SELECT 1 FROM result_files f WHERE f.instance_id = i.instance_id)) LIMIT ?"
            + for_update(conn, of="i", key=False),
            (stopped_before, limit),
        )
    ]
    for iid in ids:
        for table in _OUTPUT_TABLES:
            conn.execute(f"DELETE FROM {table} WHERE instance_id = ?", (iid,))  # noqa: S608 - fixed names
    return ids
