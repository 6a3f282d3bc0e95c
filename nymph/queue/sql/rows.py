"""Rows <-> JSON, and the one function that changes an instance's state (all synchronous,
called inside a transaction on the database thread)."""

from __future__ import annotations

import enum
import json
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
from nymph.queue.sql.dialect import Conn, Row


class Keep(enum.Enum):
    """Sentinel: leave this field as it is."""

    KEEP = 0


KEEP = Keep.KEEP

INSTANCE_COLUMNS = (
    "instance_id, namespace, provider, kube_namespace, state, reason, message, node, "
    "launched_at, updated_at, version, requester, stop_requested_at, waiting, exit_code, "
    "termination_reason, termination_message, results_error, "
    "applied_session, applied_daemon, applied_node, applied_pinned"
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
    for item, r in zip(out, rows, strict=True):
        # Why a queued launch waits: no live daemon's node can run it (see queue.sql.placement).
        if r["waiting"] and r["state"] == "queued":
            item["waiting"] = r["waiting"]
        if r["exit_code"] is not None:
            item["exitCode"] = int(r["exit_code"])
            item["terminationReason"] = r["termination_reason"] or ""
            item["terminationMessage"] = r["termination_message"] or ""
        if r["results_error"]:
            item["resultsError"] = r["results_error"]
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
    row: Row | None = conn.execute(
        f"SELECT {INSTANCE_COLUMNS} FROM instances WHERE instance_id = ?",  # noqa: S608
        (instance_id,),
    ).fetchone()
    return row


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
) -> bool:
    """Apply a change to an instance; returns True if anything changed.

    ``None`` (or :data:`KEEP` for ``reason``) leaves a field as it is. A change of state or reason
    appends to the history; any change bumps ``version``. A stopped instance never changes.
    """
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
    conn.execute(
        "UPDATE instances SET state = ?, reason = ?, message = ?, node = ?, updated_at = ?, "
        "version = version + 1 WHERE instance_id = ?",
        (new_state, new_reason, new_message, new_node, now, instance_id),
    )
    if (new_state, new_reason) != (row["state"], row["reason"]):
        conn.execute(
            "INSERT INTO instance_events (instance_id, state, reason, message, at) VALUES (?, ?, ?, ?, ?)",
            (instance_id, new_state, new_reason, new_message, now if at is None else at),
        )
    return True


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


def record_termination(conn: Conn, *, instance_id: str, termination: tuple[int, str, str]) -> bool:
    """Keep how the container ended (the first word on it stays); True if it was new."""
    code, reason, message = termination
    cur = conn.execute(
        "UPDATE instances SET exit_code = ?, termination_reason = ?, termination_message = ?, "
        "version = version + 1 WHERE instance_id = ? AND exit_code IS NULL",
        (code, reason[:200], message[:4096], instance_id),
    )
    return cur.rowcount > 0
