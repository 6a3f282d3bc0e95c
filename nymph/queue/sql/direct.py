"""Direct-dispatch instances (synchronous SQL inside the caller's transaction).

A direct launch is recorded (instance ``queued``, its connection ref and rendered Pod) before its
Pod is created, so a retry or a restart adopts the Pod under its fixed name instead of making a
second one. Pod events from the queue's watches move the instance along its history exactly as
a daemon's reports do on the other path.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nymph import fastjson
from nymph.launch.config import connection_kwargs
from nymph.launch.placement import Needs
from nymph.launch.render import render_pod
from nymph.launch.state import (
    InstanceState,
    Reason,
    container_termination,
    deleted_reason,
    pod_reason,
    pod_state,
)
from nymph.protocol import LaunchAccepted, TaskKind, now
from nymph.queue.scheduling import Candidate, Usage, charge, pick_next, quota_blocks
from nymph.queue.sql.dialect import NAMESPACE_KEYS, Conn, Row, lock_key, locks_rows
from nymph.queue.sql.launches import Guard, accept
from nymph.queue.sql.quotas import all_quotas, get_quota
from nymph.queue.sql.rows import fetch_instance
from nymph.queue.sql.schedule import charge_text, totals, usage
from nymph.queue.sql.tasks import new_task_id
from nymph.queue.sql.transitions import record_termination, transition


@dataclass(frozen=True)
class DirectLaunch:
    accepted: LaunchAccepted
    state: str
    connection: dict[str, Any]
    pod: dict[str, Any]
    #: Why its namespace's quota holds it back (its Pod is created when its turn comes), or None.
    held: str | None = None
    #: The control-plane namespace it was launched from (set by :func:`take_held`).
    namespace: str = ""


def record_launch(
    conn: Conn,
    *,
    ns: str,
    provider_name: str,
    body: Mapping[str, Any],
    idempotency_key: str | None,
    requester: str,
    guard: Guard | None = None,
    image_pull_timeout: int | None = None,
) -> DirectLaunch:
    """Record a direct launch (or find the one this Idempotency-Key recorded); a provider that
    dispatches through daemons raises :class:`~nymph.queue.sql.launches.WrongPath` (nothing
    written)."""
    got = accept(
        conn,
        ns=ns,
        provider_name=provider_name,
        body=body,
        idempotency_key=idempotency_key,
        requester=requester,
        ts=now(),
        guard=guard,
        image_pull_timeout=image_pull_timeout,
        direct=True,
    )
    if got.spec is None or got.provider is None or got.mode is None:
        row = conn.execute(
            "SELECT state, connection, pod, charge, message FROM instances WHERE instance_id = ?",
            (got.accepted["instanceId"],),
        ).fetchone()
        held = row["state"] == InstanceState.QUEUED.value and row["charge"] is None
        return DirectLaunch(
            accepted=got.accepted,
            state=row["state"],
            connection=json.loads(row["connection"]),
            pod=json.loads(row["pod"]),
            held=str(row["message"] or "held by its namespace's quota") if held else None,
        )
    spec = got.spec
    connection = {**connection_kwargs(got.provider, got.mode), "namespace": spec.namespace}
    pod = dict(render_pod(spec))
    # Its Pod is created now, unless its namespace's quota holds it: it counts towards the
    # namespace's share and quota from its Pod's creation.
    requests = Needs.from_spec(spec.to_json()).requests
    lock_key(conn, NAMESPACE_KEYS, ns)  # the namespace's usage, read and charged, as a claim does
    quota = get_quota(conn, ns)
    # what the namespace holds is read (every running launch) only when a cap may bind
    held = quota_blocks(ns, quota, usage(conn).get(ns, Usage()), requests) if quota.caps_starts else None
    message = "" if held is None else f"held: {held}; its Pod is created when its turn comes"
    conn.execute(
        "UPDATE instances SET dispatch = 'direct', connection = ?, pod = ?, charge = ?, message = ? "
        "WHERE instance_id = ?",
        (
            fastjson.dumps_text(connection),
            fastjson.dumps_text(pod),
            None if held else charge_text(requests),
            message,
            spec.instance_id,
        ),
    )
    return DirectLaunch(
        accepted=got.accepted,
        state=InstanceState.QUEUED.value,
        connection=connection,
        pod=pod,
        held=message or None,
    )


def take_held(conn: Conn, *, limit: int = 50) -> list[DirectLaunch]:
    """The held direct launches whose turn has come, oldest first within each namespace and the
    namespace with the lowest share first, each now counted towards its quota (its Pod is to be
    created by the caller). On PostgreSQL the namespaces' locks are taken first (in name
    order, as claims take them), then the launches read again."""
    if locks_rows(conn):
        names = conn.execute(
            "SELECT DISTINCT namespace FROM instances WHERE state = 'queued' AND dispatch = 'direct' "
            "AND charge IS NULL AND stop_requested_at IS NULL"
        ).fetchall()
        for name in sorted(str(r[0]) for r in names):
            lock_key(conn, NAMESPACE_KEYS, name)
    rows = conn.execute(
        "SELECT instance_id, namespace, provider, launched_at, connection, pod FROM instances "
        "WHERE state = 'queued' AND dispatch = 'direct' AND charge IS NULL AND stop_requested_at IS NULL "
        "AND launched_at <= ? ORDER BY namespace, launched_at LIMIT ?",
        (now(), limit * 4),
    ).fetchall()
    if not rows:
        return []
    quotas = all_quotas(conn)
    held = usage(conn)
    offered = totals(conn, now=now(), held=held)
    pending = {r["instance_id"]: r for r in rows}
    needs = {
        iid: Needs.from_spec({"resources": _pod_resources(r["pod"])}).requests for iid, r in pending.items()
    }
    out: list[DirectLaunch] = []
    while pending and len(out) < limit:
        first: dict[str, Row] = {}
        for r in pending.values():
            first.setdefault(r["namespace"], r)
        cands = [
            Candidate(
                seq=i,
                namespace=r["namespace"],
                priority=0,
                queued_at=float(r["launched_at"]),
                requests=needs[r["instance_id"]],
            )
            for i, r in enumerate(first.values())
        ]
        chosen = pick_next(cands, quotas=quotas, usage=held, totals=offered)
        if chosen is None:
            break
        r = list(first.values())[chosen.seq]
        del pending[r["instance_id"]]
        cur = conn.execute(
            "UPDATE instances SET charge = ?, message = '' WHERE instance_id = ? AND charge IS NULL "
            "AND state = 'queued' AND stop_requested_at IS NULL",
            (charge_text(chosen.requests), r["instance_id"]),
        )
        if not cur.rowcount:
            continue  # stopped since it was read
        held = charge(held, chosen)
        out.append(
            DirectLaunch(
                accepted=LaunchAccepted(
                    instanceId=r["instance_id"], state="queued", providerName=r["provider"], launchedAt=""
                ),
                state=InstanceState.QUEUED.value,
                connection=json.loads(r["connection"]),
                pod=json.loads(r["pod"]),
                namespace=r["namespace"],
            )
        )
    return out


def fail_held(conn: Conn, *, instance_id: str, message: str, ts: float) -> bool:
    """A held launch's Pod could not be created when its turn came: it ends LaunchFailed."""
    return transition(
        conn,
        instance_id=instance_id,
        now=ts,
        state=InstanceState.STOPPED.value,
        reason=Reason.LAUNCH_FAILED.value,
        message=message[:4096],
    )


def _pod_resources(pod_text: str | None) -> Mapping[str, Any] | None:
    try:
        pod = json.loads(pod_text) if pod_text else {}
        return pod["spec"]["containers"][0].get("resources")  # type: ignore[no-any-return]
    except (ValueError, KeyError, IndexError, TypeError):
        return None


def forget(conn: Conn, *, instance_id: str) -> None:
    """The Pod could not be created: remove every trace of the launch."""
    for table in ("idempotency_keys", "instance_logs", "instance_events", "events", "instances"):
        conn.execute(f"DELETE FROM {table} WHERE instance_id = ?", (instance_id,))  # noqa: S608


def answered(conn: Conn, *, instance_id: str, accepted: LaunchAccepted) -> None:
    """Remember the 202 actually sent (its state read from the Pod) for Idempotency-Key replays."""
    conn.execute(
        "UPDATE idempotency_keys SET response = ? WHERE instance_id = ?", (json.dumps(accepted), instance_id)
    )


def pod_change(pod: Mapping[str, Any], *, deleted: bool, stop_requested: bool) -> tuple[str, str | None, str]:
    """(state, reason, message) of an instance whose Pod looks like ``pod`` (pure)."""
    reason, message = pod_reason(pod)
    if deleted:
        if stop_requested:
            return InstanceState.STOPPED.value, Reason.STOPPED.value, "stopped on request"
        if pod_state(pod) is InstanceState.STOPPED and reason is not None:
            return InstanceState.STOPPED.value, reason.value, message
        gone = deleted_reason(pod)
        if gone is Reason.NODE_LOST:
            return InstanceState.STOPPED.value, gone.value, "the Pod was removed: its node went away"
        return InstanceState.STOPPED.value, Reason.DELETED.value, "the Pod was deleted"
    state = pod_state(pod)
    if state is InstanceState.UNKNOWN:
        return state.value, None, ""
    return state.value, None if reason is None else reason.value, message


def apply_pod(conn: Conn, *, ns: str, pod: Mapping[str, Any], deleted: bool, ts: float) -> str | None:
    """Move a direct instance of ``ns`` along with its Pod; returns its id when it changed."""
    instance_id = str((pod.get("metadata") or {}).get("name") or "")
    row = fetch_instance(conn, instance_id)
    if row is None or row["namespace"] != ns or row["dispatch"] != "direct":
        return None
    stop_requested = row["stop_requested_at"] is not None
    state, reason, message = pod_change(pod, deleted=deleted, stop_requested=stop_requested)
    if stop_requested and state not in (InstanceState.STOPPING.value, InstanceState.STOPPED.value):
        return None  # a stop was asked for: a late "running" must not undo it
    node = (pod.get("spec") or {}).get("nodeName") or None
    # How it ended is kept first: a retry policy deciding as it stops reads the exit code.
    ended = container_termination(pod)
    changed = ended is not None and record_termination(conn, instance_id=instance_id, termination=ended)
    if transition(
        conn,
        instance_id=instance_id,
        now=ts,
        state=state,
        reason=reason,
        message=message,
        node=node,
        row=None if changed else row,  # read again only if the exit code changed it
    ):
        changed = True
    if deleted:
        conn.execute("UPDATE instances SET reaped_at = ? WHERE instance_id = ?", (ts, instance_id))
    return instance_id if changed else None


def gone(conn: Conn, *, instance_id: str, ts: float) -> bool:
    """The Pod of a live direct instance is not there (found at a reconcile or a stop)."""
    row = fetch_instance(conn, instance_id)
    if row is None:
        return False
    stopped = row["stop_requested_at"] is not None
    conn.execute("UPDATE instances SET reaped_at = ? WHERE instance_id = ?", (ts, instance_id))
    return transition(
        conn,
        instance_id=instance_id,
        now=ts,
        state=InstanceState.STOPPED.value,
        reason=(Reason.STOPPED if stopped else Reason.DELETED).value,
        message="stopped on request" if stopped else "the Pod is gone",
    )


def request_stop(conn: Conn, *, instance_id: str, ts: float) -> bool:
    row = fetch_instance(conn, instance_id)
    if row is None or row["state"] == InstanceState.STOPPED.value:
        return False
    if row["stop_requested_at"] is None:
        conn.execute("UPDATE instances SET stop_requested_at = ? WHERE instance_id = ?", (ts, instance_id))
    return transition(
        conn,
        instance_id=instance_id,
        now=ts,
        state=InstanceState.STOPPING.value,
        reason=None,
        message="stop requested",
    )


def is_direct(conn: Conn, *, instance_id: str) -> bool:
    row = conn.execute("SELECT dispatch FROM instances WHERE instance_id = ?", (instance_id,)).fetchone()
    return row is not None and row[0] == "direct"


def is_reaped(conn: Conn, *, instance_id: str) -> bool:
    row = conn.execute("SELECT reaped_at FROM instances WHERE instance_id = ?", (instance_id,)).fetchone()
    return row is None or row[0] is not None


def instance_connection(conn: Conn, *, instance_id: str) -> dict[str, Any]:
    row = conn.execute("SELECT connection FROM instances WHERE instance_id = ?", (instance_id,)).fetchone()
    return dict(json.loads(row[0])) if row is not None and row[0] else {}


def watched(conn: Conn) -> set[tuple[str, str]]:
    """(namespace, connection JSON) of every direct instance whose Pod may still exist."""
    rows = conn.execute(
        "SELECT DISTINCT namespace, connection FROM instances "
        "WHERE dispatch = 'direct' AND reaped_at IS NULL AND connection IS NOT NULL"
    ).fetchall()
    return {(str(r[0]), str(r[1])) for r in rows}


def unreaped(conn: Conn) -> list[Row]:
    """Direct instances whose Pod may still exist, for the reconcile at start."""
    return list(
        conn.execute(
            "SELECT instance_id, namespace, state, connection, pod, stop_requested_at FROM instances "
            "WHERE dispatch = 'direct' AND reaped_at IS NULL ORDER BY launched_at"
        )
    )


def reapable(conn: Conn, *, before: float) -> list[Row]:
    return list(
        conn.execute(
            "SELECT instance_id, namespace, connection, node FROM instances WHERE dispatch = 'direct' "
            "AND state = 'stopped' AND reaped_at IS NULL AND updated_at < ? ORDER BY updated_at LIMIT 100",
            (before,),
        )
    )


def mark_reaped(conn: Conn, *, instance_id: str, ts: float) -> None:
    conn.execute("UPDATE instances SET reaped_at = ? WHERE instance_id = ?", (ts, instance_id))


def connections_of(conn: Conn, *, ns: str, provider: str) -> list[str]:
    rows = conn.execute(
        "SELECT DISTINCT connection FROM instances WHERE namespace = ? AND provider = ? "
        "AND dispatch = 'direct' AND reaped_at IS NULL AND connection IS NOT NULL",
        (ns, provider),
    ).fetchall()
    return [str(r[0]) for r in rows]


def record_probe(
    conn: Conn, *, ns: str, kube_ns: str, provider: str, requester: str, result: dict[str, Any]
) -> str:
    """A finished probe of a direct provider, as a task row the CLI can read like any other."""
    task_id = new_task_id()
    ts = now()
    ok = bool(result.get("ok"))
    conn.execute(
        "INSERT INTO tasks (task_id, kind, status, namespace, kube_namespace, provider, requester, "
        "attempts, result, error, created_at, updated_at, finished_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, 1, ?, ?, ?, ?, ?)",
        (
            task_id,
            TaskKind.PROBE.value,
            "done" if ok else "failed",
            ns,
            kube_ns,
            provider,
            requester,
            json.dumps(result),
            None if ok else "the direct path is not ready: see the failed checks",
            ts,
            ts,
            ts,
        ),
    )
    return task_id
