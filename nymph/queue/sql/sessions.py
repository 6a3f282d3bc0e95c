"""Daemon sessions in the database, so that every replica accepts every daemon's session
(synchronous SQL inside the caller's transaction; the rules are :mod:`nymph.queue.sessions`')."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from nymph.queue.models import DaemonSession
from nymph.queue.sql.dialect import Conn, Row

_COLUMNS = "digest, session_id, daemon_id, node, namespaces, token_id, scope, expires_at"


def session_of(row: Row) -> DaemonSession:
    return DaemonSession(
        session_id=row["session_id"],
        daemon_id=row["daemon_id"],
        node=row["node"],
        namespaces=tuple(json.loads(row["namespaces"])),
        token_id=row["token_id"],
        scope=row["scope"],
    )


def by_digest(conn: Conn, *, digest: str) -> Row | None:
    row: Row | None = conn.execute(
        f"SELECT {_COLUMNS} FROM daemon_sessions WHERE digest = ?",  # noqa: S608 - constants only
        (digest,),
    ).fetchone()
    return row


def expiries(conn: Conn, *, digests: Sequence[str]) -> dict[str, float]:
    """The expiry of each of these sessions that still exists (credential hash -> expiry), in
    one statement."""
    if not digests:
        return {}
    marks = ", ".join("?" * len(digests))
    rows = conn.execute(
        f"SELECT digest, expires_at FROM daemon_sessions WHERE digest IN ({marks})",  # noqa: S608 - placeholders only
        tuple(digests),
    ).fetchall()
    return {str(r["digest"]): float(r["expires_at"]) for r in rows}


def removed(conn: Conn) -> int:
    """How many times a session was removed or cut short (a count kept by the database's own
    triggers, whatever statement did it): while it stays the same, every session read before
    is still there, with the expiry it had or a later one. On PostgreSQL the count is spread
    over 16 rows, so that removals of different sessions do not wait for each other: their sum."""
    return int(conn.execute("SELECT SUM(removed) FROM session_marks").fetchone()[0])


def live_of_daemon(conn: Conn, *, daemon_id: str) -> list[Row]:
    return list(
        conn.execute(
            f"SELECT {_COLUMNS} FROM daemon_sessions WHERE daemon_id = ?",  # noqa: S608 - constants only
            (daemon_id,),
        )
    )


def count(conn: Conn) -> int:
    return int(conn.execute("SELECT COUNT(*) FROM daemon_sessions").fetchone()[0])


def purge(conn: Conn, *, now: float) -> None:
    conn.execute("DELETE FROM daemon_sessions WHERE expires_at <= ?", (now,))


def drop(conn: Conn, *, digest: str) -> None:
    conn.execute("DELETE FROM daemon_sessions WHERE digest = ?", (digest,))


def insert(conn: Conn, *, digest: str, session: DaemonSession, expires_at: float) -> None:
    conn.execute(
        f"INSERT INTO daemon_sessions ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",  # noqa: S608
        (
            digest,
            session.session_id,
            session.daemon_id,
            session.node,
            json.dumps(list(session.namespaces)),
            session.token_id,
            session.scope,
            expires_at,
        ),
    )


def extend_many(conn: Conn, expiries: Mapping[str, float]) -> None:
    """Move each session's expiry in ``expiries`` (credential hash -> expiry) forward, in one
    statement; a session removed, or extended further meanwhile, is left as it is."""
    conn.executemany(
        "UPDATE daemon_sessions SET expires_at = ? WHERE digest = ? AND expires_at < ?",
        [(at, digest, at) for digest, at in sorted(expiries.items())],
    )
