"""The one place an instance's state changes: :func:`transition` (state, reason, message, node,
with its history) and :func:`record_termination` (how its container ended), each with its event
in the namespace's stream (:mod:`nymph.queue.sql.events`)."""

from __future__ import annotations

import enum

from nymph.launch.placement import waiting_kind
from nymph.protocol import now as clock
from nymph.queue.sql import events, retries
from nymph.queue.sql.dialect import Conn, Row
from nymph.queue.sql.rows import fetch_instance


class Keep(enum.Enum):
    """Sentinel: leave this field as it is."""

    KEEP = 0


KEEP = Keep.KEEP


def transition(
    conn: Conn,
    *,
    instance_id: str,
    now: float,
    state: str | None = None,
    reason: str | Keep | None = KEEP,
    message: str | None = None,
    node: str | None = None,
    at: float | None = None,
    row: Row | None = None,
) -> bool:
    """Apply a change to an instance; returns True if anything changed. ``row``: the instance
    as :func:`fetch_instance` read it in this transaction, when nothing has changed it since
    (else it is read here).

    ``None`` (or :data:`KEEP` for ``reason``) leaves a field as it is. A change of state or reason
    appends to the history and a change of state, reason or node to the event stream; any change
    bumps ``version``. A stopped instance never changes. One with a retry policy may be launched
    again as it stops (:mod:`nymph.queue.sql.retries`).
    """
    if row is None:
        row = fetch_instance(conn, instance_id)
    if row is None or row["state"] == "stopped":
        return False
    new_state = row["state"] if state is None else state
    new_reason = row["reason"] if isinstance(reason, Keep) else reason
    new_message = row["message"] if message is None else message
    new_node = row["node"] if node is None else node
    if (new_state, new_reason, new_message, new_node) == (
        row["state"],
        row["reason"],
        row["message"],
        row["node"],
    ):
        return False
    # A stopped instance no longer counts towards its namespace's share and quota; one that left
    # the queue (applied on a node, or no longer queued) no longer waits.
    new_waiting = row["waiting"] if new_state == "queued" and new_node is None else None
    conn.execute(
        "UPDATE instances SET state = ?, reason = ?, message = ?, node = ?, updated_at = ?, waiting = ?, "
        "version = version + 1, charge = CASE WHEN ? = 'stopped' THEN NULL ELSE charge END "
        "WHERE instance_id = ?",
        (new_state, new_reason, new_message, new_node, now, new_waiting, new_state, instance_id),
    )
    if new_state == "stopped":
        # Its launch ran (or never will): a start task still queued must not be handed out.
        conn.execute(
            "UPDATE tasks SET status = 'done', finished_at = ?, updated_at = ? "
            "WHERE instance_id = ? AND kind IN ('launch', 'dockyard') AND status = 'pending'",
            (now, now, instance_id),
        )
    if (new_state, new_reason) != (row["state"], row["reason"]):
        conn.execute(
            "INSERT INTO instance_events (instance_id, state, reason, message, at) VALUES (?, ?, ?, ?, ?)",
            (instance_id, new_state, new_reason, new_message, now if at is None else at),
        )
    changes = events.changes_between(
        (row["state"], row["reason"], row["node"]), (new_state, new_reason, new_node)
    )
    if row["state"] == "queued" and waiting_kind(row["waiting"]) != waiting_kind(new_waiting):
        changes.append(events.WAITING)
    if changes:
        # The instance as the update above left it: what reading it back would give.
        after = {
            "namespace": row["namespace"],
            "provider": row["provider"],
            "group_id": row["group_id"],
            "attempt": row["attempt"],
            "state": new_state,
            "reason": new_reason,
            "message": new_message,
            "exit_code": row["exit_code"],
            "node": new_node,
            "waiting": new_waiting,
            "waiting_told": row["waiting_told"],
        }
        events.record_row(conn, instance_id=instance_id, row=after, changes=changes, at=now)
    if new_state == "stopped" and row["has_retry"]:
        # In this same transaction: a retry is made once per attempt, whatever is redelivered.
        retries.after_stop(conn, row=row, reason=new_reason, node=new_node, now=now)
    return True


def record_termination(conn: Conn, *, instance_id: str, termination: tuple[int, str, str]) -> bool:
    """Keep how the container ended (the first word on it stays); True if it was new."""
    code, reason, message = termination
    cur = conn.execute(
        "UPDATE instances SET exit_code = ?, termination_reason = ?, termination_message = ?, "
        "version = version + 1 WHERE instance_id = ? AND exit_code IS NULL",
        (code, reason[:200], message[:4096], instance_id),
    )
    if cur.rowcount <= 0:
        return False
    events.record(conn, instance_id=instance_id, changes=[events.EXIT], at=clock())
    return True
