"""The expiry of old instances (synchronous SQL inside the caller's write transaction).

An instance stopped longer ago than the retention period is deleted with every row that hangs
off it (:data:`OWNED_TABLES`), in batches; a tombstone (its id, scope and when it expired) stays
in ``expired_instances`` so that a GET of it says it expired, and tombstones are deleted in
their turn. A direct instance whose Pod the queue has not reaped yet is kept until it is. The
audit log on the node is the permanent record of what ran.
"""

from __future__ import annotations

from nymph.protocol import iso
from nymph.queue.errors import NotFound
from nymph.queue.sql.dialect import Conn, for_update

#: Tables holding rows of one instance by ``instance_id``, children first. A module that adds
#: such a table adds it here, or its rows outlive their instance.
OWNED_TABLES = (
    "log_chunks",
    "log_streams",
    "instance_logs",
    "result_chunks",
    "result_files",
    "instance_events",
    "idempotency_keys",
    "tasks",
)


#: The instances due to expire, oldest first (a range of ``instances_by_state_age``).
DUE = (
    "SELECT instance_id, namespace, provider FROM instances "
    "WHERE state = 'stopped' AND updated_at < ? AND (dispatch <> 'direct' OR reaped_at IS NOT NULL) "
    "ORDER BY updated_at LIMIT ?"
)


def expire(conn: Conn, *, stopped_before: float, now: float, limit: int) -> list[str]:
    """Delete at most ``limit`` instances stopped before ``stopped_before`` (oldest first), with
    their rows, leaving a tombstone of each; returns their ids."""
    # Locked: a write of one of them that waits meanwhile finds it gone.
    rows = conn.execute(DUE + for_update(conn), (stopped_before, limit)).fetchall()
    if not rows:
        return []
    ids = [str(r["instance_id"]) for r in rows]
    marks = ",".join("?" * len(ids))
    for table in OWNED_TABLES:
        conn.execute(f"DELETE FROM {table} WHERE instance_id IN ({marks})", ids)  # noqa: S608 - fixed names
    conn.execute(f"DELETE FROM instances WHERE instance_id IN ({marks})", ids)  # noqa: S608 - placeholders only
    for r in rows:
        conn.execute(
            "INSERT INTO expired_instances (instance_id, namespace, provider, expired_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (instance_id) DO NOTHING",
            (r["instance_id"], r["namespace"], r["provider"], now),
        )
    return ids


def prune_tombstones(conn: Conn, *, expired_before: float, limit: int) -> int:
    """Delete at most ``limit`` tombstones of instances that expired before ``expired_before``."""
    cur = conn.execute(
        "DELETE FROM expired_instances WHERE instance_id IN ("
        "SELECT instance_id FROM expired_instances WHERE expired_at < ? ORDER BY expired_at LIMIT ?)",
        (expired_before, limit),
    )
    return int(cur.rowcount or 0)


def not_found(conn: Conn, *, ns: str, provider: str, instance_id: str) -> NotFound:
    """The 404 for an instance the queue does not have: ``instance_expired`` when it had it and
    it expired, ``instance_not_found`` otherwise."""
    row = conn.execute(
        "SELECT namespace, provider, expired_at FROM expired_instances WHERE instance_id = ?", (instance_id,)
    ).fetchone()
    if row is not None and row["namespace"] == ns and row["provider"] == provider:
        return NotFound(
            f"instance {instance_id!r} expired: it had stopped longer ago than the queue keeps "
            f"instances (--retention-days) and was removed at {iso(row['expired_at'])}; the audit "
            "log on its node keeps what ran",
            code="instance_expired",
        )
    return NotFound(
        f"no instance {instance_id!r} of provider {provider!r} in namespace {ns!r}: "
        "list them with 'nymph instances PROVIDER'",
        code="instance_not_found",
    )
