"""Leases a daemon holds: renewed, handed back one by one, or all at once (synchronous SQL,
each function called inside one write transaction on the database thread)."""

from __future__ import annotations

from collections.abc import Sequence

from nymph.queue.models import DaemonSession
from nymph.queue.sql.dialect import Conn
from nymph.queue.sql.rows import session_filter


def renew(
    conn: Conn,
    *,
    session: DaemonSession,
    task_ids: Sequence[str],
    lease_seconds: int,
    now: float,
) -> tuple[list[str], list[str]]:
    """Extend the leases the session's daemon holds; any other id (leased to another daemon,
    outside the session's namespaces, unknown) is reported lost and left alone."""
    renewed: list[str] = []
    lost: list[str] = []
    where, params = session_filter(session)
    for task_id in task_ids:
        cur = conn.execute(
            "UPDATE tasks SET lease_expires = ?, updated_at = ? WHERE task_id = ? "  # noqa: S608 - placeholders only
            "AND status = 'leased' AND lease_owner = ? AND lease_expires > ?" + where,
            (now + lease_seconds, now, task_id, session.daemon_id, now, *params),
        )
        (renewed if cur.rowcount else lost).append(task_id)
    return renewed, lost


def release(conn: Conn, *, session: DaemonSession, task_ids: Sequence[str], now: float) -> list[str]:
    """Hand back leases the session's daemon holds; returns those handed back."""
    released = []
    where, params = session_filter(session)
    for task_id in task_ids:
        cur = conn.execute(
            "UPDATE tasks SET status = 'pending', last_owner = lease_owner, lease_owner = NULL, lease_expires = NULL, "  # noqa: S608 - placeholders only
            "attempts = GREATEST(attempts - 1, 0), updated_at = ? "
            "WHERE task_id = ? AND status = 'leased' AND lease_owner = ?" + where,
            (now, task_id, session.daemon_id, *params),
        )
        if cur.rowcount:
            released.append(task_id)
    return released


def release_all(conn: Conn, *, session: DaemonSession, now: float) -> list[str]:
    """Hand back every lease the session's daemon holds; returns the task ids handed back."""
    rows = conn.execute(
        "SELECT task_id FROM tasks WHERE status = 'leased' AND lease_owner = ?", (session.daemon_id,)
    ).fetchall()
    return release(conn, session=session, task_ids=[r[0] for r in rows], now=now)
