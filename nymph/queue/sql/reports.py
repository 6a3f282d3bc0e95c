"""What daemons send back besides completions: state reports, logs, and the list of instances a
node should be running (synchronous SQL inside one transaction on the database thread)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from nymph.launch.state import InstanceState
from nymph.protocol import ActiveJSON
from nymph.queue.errors import NotFound
from nymph.queue.models import Report
from nymph.queue.sql.rows import fetch_instance, transition


def report(
    conn: sqlite3.Connection,
    *,
    stream: str,
    reports: Sequence[Report],
    scope: str | None,
    now: float,
) -> tuple[int, int, set[str]]:
    """Apply reports with seq above the stream's mark, in the order given.

    Returns (accepted, last_seq, changed instance ids); ``last_seq`` is -1 for a new stream.
    """
    row = conn.execute("SELECT last_seq FROM report_streams WHERE stream = ?", (stream,)).fetchone()
    last = -1 if row is None else int(row[0])
    accepted = 0
    changed: set[str] = set()
    for r in reports:
        if r.seq <= last:
            continue
        last = r.seq
        accepted += 1
        inst = fetch_instance(conn, r.instance_id)
        if inst is None or (scope is not None and inst["namespace"] != scope):
            continue
        if inst["stop_requested_at"] is not None and r.state not in (
            InstanceState.STOPPING.value,
            InstanceState.STOPPED.value,
        ):
            continue  # a stop was asked for: a late "starting"/"running" must not undo it
        if transition(
            conn,
            instance_id=r.instance_id,
            now=now,
            state=r.state,
            reason=r.reason,
            message=r.message or "",
            node=r.node,
            at=r.at,
        ):
            changed.add(r.instance_id)
    if accepted:
        conn.execute(
            "INSERT INTO report_streams (stream, last_seq, updated_at) VALUES (?, ?, ?) "
            "ON CONFLICT (stream) DO UPDATE SET last_seq = excluded.last_seq, "
            "updated_at = excluded.updated_at",
            (stream, last, now),
        )
    return accepted, last, changed


def store_logs(
    conn: sqlite3.Connection,
    *,
    instance_id: str,
    logs: str,
    scope: str | None,
    max_bytes: int,
    now: float,
) -> None:
    inst = fetch_instance(conn, instance_id)
    if inst is None or (scope is not None and inst["namespace"] != scope):
        raise NotFound(
            f"no instance {instance_id!r}: upload logs only for instances you run", code="instance_not_found"
        )
    data = logs.encode("utf-8", errors="replace")
    if len(data) > max_bytes:
        dropped = len(data) - max_bytes
        marker = f"[nymph: first {dropped} bytes of the log dropped]\n".encode()
        data = marker + data[len(data) - max_bytes + len(marker) :]
    conn.execute(
        "INSERT INTO instance_logs (instance_id, text, updated_at) VALUES (?, ?, ?) "
        "ON CONFLICT (instance_id) DO UPDATE SET text = excluded.text, updated_at = excluded.updated_at",
        (instance_id, data.decode("utf-8", errors="ignore"), now),
    )


def active(conn: sqlite3.Connection, *, node: str, scope: str | None) -> list[ActiveJSON]:
    sql = (
        "SELECT instance_id, namespace, kube_namespace, state, node FROM instances "
        "WHERE node = ? AND state != 'stopped'"
    )
    params: list[Any] = [node]
    if scope is not None:
        sql += " AND namespace = ?"
        params.append(scope)
    return [
        ActiveJSON(
            instanceId=r["instance_id"],
            namespace=r["namespace"],
            kubeNamespace=r["kube_namespace"],
            state=r["state"],
            node=r["node"],
        )
        for r in conn.execute(sql + " ORDER BY launched_at", params)
    ]
