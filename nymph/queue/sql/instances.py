"""Reading instances, their stored logs and task status, and stopping an instance, scoped to a
control-plane namespace and provider (synchronous SQL inside the caller's transaction)."""

from __future__ import annotations

import json
from typing import Any

from nymph.launch.state import InstanceState, Reason
from nymph.protocol import START_KINDS, InstanceJSON, TaskKind, TaskStatusJSON, now
from nymph.queue.errors import NotFound
from nymph.queue.sql import expiry
from nymph.queue.sql.dialect import Conn, Row
from nymph.queue.sql.rows import INSTANCE_COLUMNS, fetch_instance, instances_json, task_status_json
from nymph.queue.sql.tasks import insert_task
from nymph.queue.sql.transitions import transition


def instance_row(conn: Conn, *, ns: str, provider: str, instance_id: str) -> Row:
    row = fetch_instance(conn, instance_id)
    if row is None or row["namespace"] != ns or row["provider"] != provider:
        raise expiry.not_found(conn, ns=ns, provider=provider, instance_id=instance_id)
    return row


def list_instances(conn: Conn, *, ns: str, provider: str, state: str | None) -> list[InstanceJSON]:
    sql = f"SELECT {INSTANCE_COLUMNS} FROM instances WHERE namespace = ? AND provider = ?"  # noqa: S608
    params: list[Any] = [ns, provider]
    if state is not None:
        sql += " AND state = ?"
        params.append(state)
    rows = conn.execute(sql + " ORDER BY launched_at, instance_id", params).fetchall()
    return instances_json(conn, rows)


def get_instance(conn: Conn, *, ns: str, provider: str, instance_id: str) -> InstanceJSON:
    return instances_json(conn, [instance_row(conn, ns=ns, provider=provider, instance_id=instance_id)])[0]


def get_task(conn: Conn, *, ns: str, task_id: str) -> TaskStatusJSON:
    row = conn.execute("SELECT * FROM tasks WHERE task_id = ? AND namespace = ?", (task_id, ns)).fetchone()
    if row is None:
        raise NotFound(f"no task {task_id!r} in namespace {ns!r}", code="task_not_found")
    return task_status_json(row)


def stop(
    conn: Conn,
    *,
    ns: str,
    provider: str,
    instance_id: str,
    grace: int | None,
    requester: str,
) -> tuple[bool, bool]:
    """Returns (instance changed, task queued). The instance's row is locked (its writes run one
    after another); its start task is cancelled only while still pending: a claim leasing it
    meanwhile (on any replica) wins, and the stop is ordered after that lease."""
    row = instance_row(conn, ns=ns, provider=provider, instance_id=instance_id)
    if row["state"] == InstanceState.STOPPED.value or row["stop_requested_at"] is not None:
        return False, False
    ts = now()
    conn.execute("UPDATE instances SET stop_requested_at = ? WHERE instance_id = ?", (ts, instance_id))
    marks = ",".join("?" * len(START_KINDS))
    launch = conn.execute(
        "SELECT task_id, kind, status, attempts, spec FROM tasks "  # noqa: S608 - placeholders only
        f"WHERE instance_id = ? AND kind IN ({marks}) ORDER BY seq DESC LIMIT 1",
        (instance_id, *START_KINDS),
    ).fetchone()
    status = None if launch is None else launch["status"]
    if launch is not None and status == "pending":
        cancelled = conn.execute(
            "UPDATE tasks SET status = 'cancelled', finished_at = ?, updated_at = ?, "
            "error = 'stopped before it was applied' WHERE task_id = ? AND status = 'pending'",
            (ts, ts, launch["task_id"]),
        ).rowcount
        if not cancelled:  # leased (or settled) since it was read
            status = conn.execute(
                "SELECT status FROM tasks WHERE task_id = ?", (launch["task_id"],)
            ).fetchone()[0]
        elif launch["attempts"] == 0:
            transition(
                conn,
                instance_id=instance_id,
                now=ts,
                state=InstanceState.STOPPED.value,
                reason=Reason.STOPPED.value,
                message="stopped before a daemon picked up the launch",
            )
            return True, False
    after = launch["task_id"] if launch is not None and status == "leased" else None
    # A dockyard instance has no Pod named after it: its stop task carries the dockyard spec, so
    # the daemon renders the same objects again and deletes them.
    stop_spec = None
    if launch is not None and launch["kind"] == TaskKind.DOCKYARD.value:
        stop_spec = {"dockyard": json.loads(launch["spec"])}
    insert_task(
        conn,
        kind=TaskKind.STOP.value,
        ns=ns,
        kube_ns=row["kube_namespace"],
        provider=provider,
        instance_id=instance_id,
        spec=stop_spec,
        requester=requester,
        ts=ts,
        after=after,
        grace=grace,
    )
    transition(
        conn,
        instance_id=instance_id,
        now=ts,
        state=InstanceState.STOPPING.value,
        reason=None,
        message="stop requested",
    )
    return True, True
