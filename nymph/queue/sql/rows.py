"""Rows <-> JSON and the daemon-session filters (all synchronous, called inside a transaction on
the database thread); an instance's state changes in :mod:`nymph.queue.sql.transitions`."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from nymph.protocol import (
    HistoryEntry,
    InstanceJSON,
    TaskJSON,
    TaskStatusJSON,
    iso,
)
from nymph.queue.models import DaemonSession
from nymph.queue.sql import waiting
from nymph.queue.sql.dialect import Conn, Row, for_update, locks_rows

INSTANCE_COLUMNS = (
    "instance_id, namespace, provider, kube_namespace, state, reason, message, node, "
    "launched_at, updated_at, version, requester, stop_requested_at, waiting, exit_code, "
    "termination_reason, termination_message, results_error, "
    "applied_session, applied_daemon, applied_node, applied_pinned, group_id, group_index, "
    "attempt, retry_of, retried_as, retry IS NOT NULL AS has_retry, waiting_told, dispatch"
)


def instances_json(conn: Conn, rows: Sequence[Row]) -> list[InstanceJSON]:
    """Instance rows -> JSON, with their history fetched in one query."""
    if not rows:
        return []
    history: dict[str, list[HistoryEntry]] = {r["instance_id"]: [] for r in rows}
    ids = list(history)
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        marks = ",".join("?" * len(chunk))
        for ev in conn.execute(
            f"SELECT instance_id, state, reason, message, at FROM instance_events "  # noqa: S608
            f"WHERE instance_id IN ({marks}) ORDER BY id",
            chunk,
        ):
            history[ev["instance_id"]].append(
                HistoryEntry(state=ev["state"], reason=ev["reason"], message=ev["message"], at=iso(ev["at"]))
            )
    out = [
        InstanceJSON(
            instanceId=r["instance_id"],
            providerName=r["provider"],
            namespace=r["namespace"],
            kubeNamespace=r["kube_namespace"],
            state=r["state"],
            reason=r["reason"],
            message=r["message"],
            node=r["node"],
            launchedAt=iso(r["launched_at"]),
            updatedAt=iso(r["updated_at"]),
            version=r["version"],
            requester=r["requester"],
            history=history[r["instance_id"]],
        )
        for r in rows
    ]
    # Why a queued launch waits: no live daemon's node can run it (see queue.sql.placement),
    # else its quota or where it stands in its namespace's queue (see queue.sql.waiting).
    standing = waiting.reasons(conn, rows, now=time.time())
    for item, r in zip(out, rows, strict=True):
        if r["waiting"] and r["state"] == "queued":
            item["waiting"] = r["waiting"]
        elif r["instance_id"] in standing:
            item["waiting"] = standing[r["instance_id"]]
        if r["exit_code"] is not None:
            item["exitCode"] = int(r["exit_code"])
            item["terminationReason"] = r["termination_reason"] or ""
            item["terminationMessage"] = r["termination_message"] or ""
        if r["results_error"]:
            item["resultsError"] = r["results_error"]
        if r["group_id"] is not None:
            item["groupId"] = r["group_id"]
            item["groupIndex"] = int(r["group_index"] or 0)
        if r["has_retry"] or r["retry_of"] is not None or int(r["attempt"] or 1) > 1:
            item["attempt"] = int(r["attempt"] or 1)
        if r["retry_of"] is not None:
            item["retryOf"] = r["retry_of"]
        if r["retried_as"] is not None:
            item["retriedAs"] = r["retried_as"]
    return out


def session_filter(session: DaemonSession, *, alias: str = "") -> tuple[str, list[Any]]:
    """SQL (`` AND ...`` or empty) and parameters confining a task or instance query to what a
    daemon session may act on: the kube namespaces it serves and its token's owner scope."""
    clauses: list[str] = []
    params: list[Any] = []
    if session.namespaces:
        clauses.append(f"{alias}kube_namespace IN ({','.join('?' * len(session.namespaces))})")
        params.extend(session.namespaces)
    if session.scope is not None:
        clauses.append(f"{alias}namespace = ?")
        params.append(session.scope)
    return "".join(f" AND {c}" for c in clauses), params


def session_may_act(session: DaemonSession, row: Row) -> bool:
    """Whether a task or instance row is within a daemon session's namespaces and scope (what
    it may see; which instances it may write is :mod:`nymph.queue.sql.binding`'s)."""
    return session.serves(row["kube_namespace"]) and (
        session.scope is None or row["namespace"] == session.scope
    )


def fetch_instance(conn: Conn, instance_id: str) -> Row | None:
    """The instance's row; in a PostgreSQL write, locked until the commit: every write that
    decides from an instance's row reads it here first, so the writes of one instance run one
    after another (on any replica) while those of different instances run at once."""
    row: Row | None = conn.execute(
        f"SELECT {INSTANCE_COLUMNS} FROM instances WHERE instance_id = ?" + for_update(conn, key=False),  # noqa: S608
        (instance_id,),
    ).fetchone()
    return row


def lock_instance(conn: Conn, instance_id: str) -> None:
    """Lock the instance's row as :func:`fetch_instance` does, for a write that needs no more of
    it (its log, its log tail)."""
    if locks_rows(conn):
        conn.execute("SELECT 1 FROM instances WHERE instance_id = ? FOR NO KEY UPDATE", (instance_id,))


def task_json(row: Row) -> TaskJSON:
    out = TaskJSON(
        taskId=row["task_id"],
        kind=row["kind"],
        instanceId=row["instance_id"],
        namespace=row["namespace"],
        kubeNamespace=row["kube_namespace"],
        provider=row["provider"],
        spec=json.loads(row["spec"]) if row["spec"] else None,
        requester=row["requester"],
        attempt=row["attempts"],
        leaseExpiresAt=iso(row["lease_expires"] or 0.0),
    )
    if row["grace_period"] is not None:
        out["gracePeriodSeconds"] = row["grace_period"]
    return out


def task_status_json(row: Row) -> TaskStatusJSON:
    result: Any = json.loads(row["result"]) if row["result"] else None
    return TaskStatusJSON(
        taskId=row["task_id"],
        kind=row["kind"],
        status=row["status"],
        result=result if isinstance(result, dict) else None,
        error=row["error"],
        attempts=row["attempts"],
    )


def waited_since_post(rows: Sequence[Row], now: float) -> list[float]:
    """How long each launch row on its first attempt waited since its POST wrote it."""
    return [now - float(r["created_at"]) for r in rows if r["kind"] == "launch" and int(r["attempts"]) == 1]
