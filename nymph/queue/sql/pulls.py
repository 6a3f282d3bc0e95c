"""Direct instances whose image cannot be pulled (synchronous SQL inside the caller's
transaction): which ones have been failing their pull and since when (the history entry that
moved them to ``starting`` / ``ImagePull``, so the clock survives a restart of the queue), and
ending one of them ``stopped`` / ``ImagePull``."""

from __future__ import annotations

from dataclasses import dataclass

from nymph.launch.pullwait import since_from_history
from nymph.launch.state import InstanceState, Reason
from nymph.queue.sql.dialect import Conn
from nymph.queue.sql.transitions import transition


@dataclass(frozen=True)
class FailingPull:
    instance_id: str
    namespace: str
    connection: str
    pod: str
    #: When its pull was first seen failing (the queue's clock).
    since: float


def failing_pulls(conn: Conn, *, limit: int = 500) -> list[FailingPull]:
    """Live direct instances in ``starting`` / ``ImagePull`` (no stop asked for), with since when."""
    rows = conn.execute(
        "SELECT instance_id, namespace, connection, pod FROM instances WHERE dispatch = 'direct' "
        "AND state = ? AND reason = ? AND stop_requested_at IS NULL AND reaped_at IS NULL "
        "AND connection IS NOT NULL AND pod IS NOT NULL LIMIT ?",
        (InstanceState.STARTING.value, Reason.IMAGE_PULL.value, limit),
    ).fetchall()
    out = []
    for r in rows:
        events = conn.execute(
            "SELECT at, state, reason FROM instance_events WHERE instance_id = ? ORDER BY id",
            (r["instance_id"],),
        ).fetchall()
        since = since_from_history([(float(e[0]), str(e[1]), e[2]) for e in events])
        if since is not None:
            out.append(
                FailingPull(
                    instance_id=str(r["instance_id"]),
                    namespace=str(r["namespace"]),
                    connection=str(r["connection"]),
                    pod=str(r["pod"]),
                    since=since,
                )
            )
    return out


def end_pull(conn: Conn, *, instance_id: str, message: str, ts: float) -> bool:
    """The instance ends ``stopped`` / ``ImagePull`` (its Pod is deleted by the caller, or reaped)."""
    return transition(
        conn,
        instance_id=instance_id,
        now=ts,
        state=InstanceState.STOPPED.value,
        reason=Reason.IMAGE_PULL.value,
        message=message[:4096],
    )
