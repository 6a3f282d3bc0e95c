"""Tasks that must not be handed out again (synchronous SQL inside a claim's or the sweep's
write transaction)."""

from __future__ import annotations

from nymph.launch.state import InstanceState, Reason
from nymph.protocol import START_KINDS
from nymph.queue.sql.dialect import Conn
from nymph.queue.sql.transitions import transition

_START_SQL = ",".join(f"'{k}'" for k in START_KINDS)

#: A task handed out this many times without ever being completed (each time its daemon died
#: or lost it before reporting) is given up on: at-least-once delivery, but not forever.
MAX_DELIVERIES = 10


def retire(conn: Conn, *, now: float) -> set[str]:
    """Settle tasks that must not be handed out again; returns instances that changed.

    * a launch (or dockyard launch) whose lease expired while its instance already stopped (it
      was applied and ran; only its completion was lost) is done: redelivering it after the Pod
      was reaped would run the job twice (a pending one is settled when its instance stops, by
      :func:`nymph.queue.sql.transitions.transition`);
    * a task whose lease expired ``MAX_DELIVERIES`` times fails, and its launch with it.
    """
    conn.execute(
        "UPDATE tasks SET status = 'done', finished_at = ?, updated_at = ?, lease_owner = NULL, "  # noqa: S608 - constant fragments only
        f"lease_expires = NULL WHERE kind IN ({_START_SQL}) AND status = 'leased' AND lease_expires <= ? "
        "AND instance_id IN (SELECT instance_id FROM instances WHERE state = 'stopped')",
        (now, now, now),
    )
    changed: set[str] = set()
    rows = conn.execute(
        "SELECT seq, kind, instance_id FROM tasks WHERE status = 'leased' AND lease_expires <= ? AND attempts >= ?",
        (now, MAX_DELIVERIES),
    ).fetchall()
    for seq, kind, instance_id in rows:
        message = f"gave up after {MAX_DELIVERIES} deliveries whose daemon never completed the task"
        cur = conn.execute(
            "UPDATE tasks SET status = 'failed', error = ?, finished_at = ?, updated_at = ?, "
            "lease_owner = NULL, lease_expires = NULL WHERE seq = ? AND status = 'leased' AND lease_expires <= ?",
            (message, now, now, seq, now),
        )
        if (
            cur.rowcount
            and kind in START_KINDS
            and instance_id
            and transition(
                conn,
                instance_id=instance_id,
                now=now,
                state=InstanceState.STOPPED.value,
                reason=Reason.LAUNCH_FAILED.value,
                message=message,
            )
        ):
            changed.add(instance_id)
    return changed
