"""Claims and leases: claim, renew, release, complete, retire, sweep, and the daemons table
(synchronous SQL, each function called inside one write transaction on the database thread).

A task is claimable when it is ``pending`` (or ``leased`` with an expired lease), its
``not_before`` has passed, the task it is ordered after (a stop after its launch) has
finished, its kube namespace is one the daemon serves, the daemon's token scope covers its
owner namespace, for a stop task, the daemon is on the instance's node, the instance has
no node yet, or the stop has waited longer than the node fallback, and for a launch, the
daemon's node (when it sent what it offers) matches the launch's node selector, tolerations
and requests (see :mod:`nymph.queue.sql.placement`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from nymph.launch.state import InstanceState, Reason
from nymph.protocol import FINISHED_STATUSES, START_KINDS, CompleteAnswer, iso
from nymph.queue.errors import Conflict, NotFound
from nymph.queue.models import ClaimRequest, ClaimResult, DaemonSession, LeaseSettings, RetrySettings
from nymph.queue.sql import binding, events, placement, schedule
from nymph.queue.sql.dialect import Conn, for_update, indexed_by
from nymph.queue.sql.retire import retire
from nymph.queue.sql.rows import fetch_instance, session_may_act, task_json, waited_since_post
from nymph.queue.sql.transitions import transition

_FINISHED_SQL = ",".join(f"'{s}'" for s in FINISHED_STATUSES)
_START_SQL = ",".join(f"'{k}'" for k in START_KINDS)
#: When a stop task became claimable at all: its creation, or the end of the task it waits on.
_READY_SINCE = "GREATEST(t.created_at, COALESCE(a.finished_at, t.created_at))"
_MAX_ERROR_CHARS = 4096
#: How stale a daemon's lastSeen may get before an idle claim refreshes it: long enough that a
#: thousand daemons re-polling after each long-poll's timeout (at most ``max_wait``, 60 s) read
#: instead of writing, short enough that a polling daemon stays live (``placement.LIVE_SECONDS``,
#: 150 s, above this plus the longest wait).
_SEEN_REFRESH = 60.0
_SELECT_CLAIMABLE = (
    "SELECT t.seq, t.kind, t.spec FROM tasks t{hint} "
    "LEFT JOIN instances i ON i.instance_id = t.instance_id "
    "LEFT JOIN tasks a ON a.task_id = t.after_task "
    "WHERE {where} ORDER BY t.seq LIMIT ?{lock}"
)
#: PostgreSQL, no node offer: select and lease in one statement; rows another replica's claim
#: is leasing right now are skipped, never waited for or handed out twice.
_CLAIM_ONE_STATEMENT = (
    "UPDATE tasks SET status = 'leased', lease_owner = ?, lease_expires = ?, "  # noqa: S608 - constants
    "attempts = attempts + 1, updated_at = ? WHERE seq IN ("
    + _SELECT_CLAIMABLE.replace("t.seq, t.kind, t.spec", "t.seq")
    + ") RETURNING *"
)
#: Only a task still pending is leased: another write (a stop) may have settled it since the
#: claim read it (PostgreSQL writes run at once); what was leased is read back by its seq.
_LEASE = (
    "UPDATE tasks SET status = 'leased', lease_owner = ?, lease_expires = ?, "
    "attempts = attempts + 1, updated_at = ? WHERE seq IN ({marks}) AND status = 'pending' RETURNING seq"
)
_FETCH = "SELECT * FROM tasks WHERE seq IN ({marks}) ORDER BY seq"


def _claimable(req: ClaimRequest, *, scope: str | None, now: float, fallback: float) -> tuple[str, list[Any]]:
    """The tasks handed out in order, before the scheduler's: stops, probes (and launches
    queued before launches had a scheduling group)."""
    clauses = [
        "t.status = 'pending'",
        "t.grp IS NULL",
        "t.not_before <= ?",
        f"(t.after_task IS NULL OR a.status IN ({_FINISHED_SQL}))",
        "(t.kind != 'stop' OR i.node IS NULL OR i.node = ? OR " + _READY_SINCE + " <= ?)",
    ]
    params: list[Any] = [now, req.node, now - fallback]
    if scope is not None:
        clauses.append("t.namespace = ?")
        params.append(scope)
    if req.namespaces:
        clauses.append(f"t.kube_namespace IN ({','.join('?' * len(req.namespaces))})")
        params.extend(req.namespaces)
    return " AND ".join(clauses), params


def _next_due(conn: Conn, *, node: str, now: float, fallback: float) -> float | None:
    due_hint, plain_hint = indexed_by(conn, "tasks_due"), indexed_by(conn, "tasks_plain")
    row = conn.execute(
        f"""
        SELECT MIN(due) FROM (
            SELECT not_before AS due FROM tasks{due_hint}
                WHERE status = 'pending' AND not_before > 0 AND not_before > :now
            UNION ALL
            SELECT lease_expires FROM tasks WHERE status = 'leased' AND lease_expires > :now
            UNION ALL
            SELECT {_READY_SINCE} + :fallback FROM tasks t{plain_hint}
                JOIN instances i ON i.instance_id = t.instance_id
                LEFT JOIN tasks a ON a.task_id = t.after_task
                WHERE t.kind = 'stop' AND t.status = 'pending' AND t.grp IS NULL AND i.node IS NOT NULL
                  AND i.node != :node AND {_READY_SINCE} + :fallback > :now
        ) AS due_times
        """,  # noqa: S608 - constant fragments only
        {"now": now, "fallback": fallback, "node": node},
    ).fetchone()
    return None if row[0] is None else float(row[0])


def _record_state(conn: Conn, *, req: ClaimRequest, now: float) -> str:
    """The daemon's record against this claim: "fresh" (as claimed, seen lately), "stale" (as
    claimed, its ``last_seen`` due a refresh) or "changed" (missing, or another node, namespace,
    capacity or offer)."""
    row = conn.execute(
        "SELECT node, namespaces, capacity, node_info, last_seen FROM daemons WHERE daemon_id = ?",
        (req.daemon_id,),
    ).fetchone()
    if row is None or (row[0], row[1], row[2], row[3]) != req.record:
        return "changed"
    return "fresh" if now - row[4] < _SEEN_REFRESH else "stale"


def _seen_fresh(conn: Conn, *, req: ClaimRequest, now: float) -> bool:
    """Whether the daemon's record is unchanged and fresh, so a claim that finds no work need
    write nothing, and its commit costs no fsync."""
    return _record_state(conn, req=req, now=now) == "fresh"


def refresh_seen(conn: Conn, seen: Mapping[str, float]) -> None:
    """Move the ``last_seen`` of each daemon in ``seen`` (id -> when its claim came) forward, in
    one statement: idle claims whose records were due a refresh, batched by the store. A record
    removed or seen later meanwhile is left as it is."""
    conn.executemany(
        "UPDATE daemons SET last_seen = ? WHERE daemon_id = ? AND last_seen < ?",
        [(at, daemon_id, at) for daemon_id, at in sorted(seen.items())],
    )


def _seen(conn: Conn, *, req: ClaimRequest, now: float) -> None:
    """Record the daemon. Skipped while nothing changed and the record is fresh (many daemons
    wait on claims; all but one usually find nothing)."""
    if _seen_fresh(conn, req=req, now=now):
        return
    node, namespaces, capacity, node_info = req.record
    conn.execute(
        "INSERT INTO daemons (daemon_id, node, namespaces, capacity, node_info, last_seen) "
        "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (daemon_id) DO UPDATE SET node = excluded.node, "
        "namespaces = excluded.namespaces, capacity = excluded.capacity, "
        "node_info = excluded.node_info, last_seen = excluded.last_seen",
        (req.daemon_id, node, namespaces, capacity, node_info, now),
    )


def _work_elsewhere(conn: Conn, *, now: float) -> bool:
    """Whether any task at all is waiting to be claimed (by whichever daemon may take it)."""
    pending = conn.execute(
        "SELECT 1 FROM tasks WHERE status = 'pending' AND not_before <= ? LIMIT 1", (now,)
    ).fetchone()
    return pending is not None or _expired_leases(conn, now=now)


def _expired_leases(conn: Conn, *, now: float) -> bool:
    row = conn.execute(
        "SELECT 1 FROM tasks WHERE status = 'leased' AND lease_expires <= ? LIMIT 1", (now,)
    ).fetchone()
    return row is not None


def _requeue_expired(conn: Conn, *, now: float) -> int:
    """Hand expired leases back to the queue (each goes where its kind and group are taken)."""
    cur = conn.execute(
        "UPDATE tasks SET status = 'pending', last_owner = lease_owner, lease_owner = NULL, lease_expires = NULL, "
        "updated_at = ? WHERE status = 'leased' AND lease_expires <= ?",
        (now, now),
    )
    return cur.rowcount


def _scheduled(
    conn: Conn, *, req: ClaimRequest, scope: str | None, now: float, limit: int, lock: bool = False
) -> list[schedule.Head]:
    """The launches the scheduler hands this daemon (see :mod:`nymph.queue.sql.schedule`)."""
    only = (
        schedule.lock_namespaces(conn, kube_namespaces=req.namespaces, scope=scope, now=now) if lock else None
    )
    offer = req.node_info

    def used() -> dict[str, Fraction]:
        return placement.placed_on(conn, node=req.node, now=now)

    return schedule.plan(
        conn,
        kube_namespaces=req.namespaces,
        scope=scope,
        offer=offer,
        used_on_node=None if offer is None else used,
        now=now,
        limit=limit,
        only=only,
    )


def idle_claim(
    conn: Conn, *, req: ClaimRequest, scope: str | None, now: float, lease: LeaseSettings
) -> ClaimResult | None:
    """The answer to a claim with nothing to take, read-only (a read transaction, no fsync);
    None when the claim may find work or must record the daemon (run :func:`claim`). A record
    only due a refresh is answered here too, with ``seen_due`` (the store batches the writes)."""
    state = _record_state(conn, req=req, now=now)
    if state == "changed":
        return None
    if req.capacity > 0:
        if _expired_leases(conn, now=now):
            return None
        where, params = _claimable(req, scope=scope, now=now, fallback=lease.stop_node_fallback)
        # Only constant fragments and "?" placeholders are formatted into this statement.
        if (
            conn.execute(
                _SELECT_CLAIMABLE.format(where=where, lock="", hint=indexed_by(conn, "tasks_plain")),
                [*params, 1],
            ).fetchone()
            is not None
        ):
            return None
        if _scheduled(conn, req=req, scope=scope, now=now, limit=1):
            return None
    return ClaimResult(
        tasks=[],
        next_due=_next_due(conn, node=req.node, now=now, fallback=lease.stop_node_fallback),
        work_elsewhere=_work_elsewhere(conn, now=now),
        seen_due=state == "stale",
    )


def claim(
    conn: Conn,
    *,
    req: ClaimRequest,
    scope: str | None,
    now: float,
    lease: LeaseSettings,
) -> ClaimResult:
    _seen(conn, req=req, now=now)
    settled = retire(conn, now=now)
    _requeue_expired(conn, now=now)
    tasks = []
    waited: list[float] = []
    if req.capacity > 0:
        where, params = _claimable(req, scope=scope, now=now, fallback=lease.stop_node_fallback)
        # Only constant fragments and "?" placeholders are formatted into these statements.
        lock = for_update(conn, of="t", skip_locked=True)
        if lock and req.node_info is None:
            stmt = _CLAIM_ONE_STATEMENT.format(where=where, lock=lock, hint="")
            leased = conn.execute(stmt, [req.daemon_id, now + req.lease_seconds, now, *params, req.capacity])
            first = sorted(leased.fetchall(), key=lambda r: int(r["seq"]))
            tasks = [task_json(r) for r in first]
            waited = waited_since_post(first, now)
            seqs = []
        else:
            select = _SELECT_CLAIMABLE.format(where=where, lock=lock, hint=indexed_by(conn, "tasks_plain"))
            # With a node offer, look past launches this node cannot run (they stay for others).
            limit = req.capacity if req.node_info is None else req.capacity + placement.SCAN_EXTRA
            rows = conn.execute(select, [*params, limit]).fetchall()
            seqs = placement.pick(
                conn, rows, offer=req.node_info, node=req.node, capacity=req.capacity, now=now
            )
        room = req.capacity - len(tasks) - len(seqs)
        if room > 0:
            picked = _scheduled(conn, req=req, scope=scope, now=now, limit=room, lock=True)
            picked = schedule.mark_charged(conn, picked)
            schedule.record_recent(conn, picked, now=now)
            seqs = [*seqs, *(h.candidate.seq for h in picked)]
        if seqs:
            marks = ",".join("?" * len(seqs))
            won = conn.execute(
                _LEASE.format(marks=marks), [req.daemon_id, now + req.lease_seconds, now, *seqs]
            )
            ours = [int(r[0]) for r in won.fetchall()]
            if ours:
                marks = ",".join("?" * len(ours))
                fetched = conn.execute(_FETCH.format(marks=marks), ours).fetchall()
                tasks = [*tasks, *(task_json(r) for r in fetched)]
                waited = [*waited, *waited_since_post(fetched, now)]
    next_due = None
    elsewhere = False
    if not tasks:
        next_due = _next_due(conn, node=req.node, now=now, fallback=lease.stop_node_fallback)
        elsewhere = _work_elsewhere(conn, now=now)
    return ClaimResult(
        tasks=tasks,
        next_due=next_due,
        settled=frozenset(settled),
        work_elsewhere=elsewhere,
        waited=tuple(waited),
    )


def _stop_requested(conn: Conn, instance_id: str) -> bool:
    inst = fetch_instance(conn, instance_id)
    return inst is not None and inst["stop_requested_at"] is not None


def complete(
    conn: Conn,
    *,
    session: DaemonSession,
    task_id: str,
    ok: bool,
    error: str | None,
    retryable: bool,
    result: dict[str, Any] | None,
    now: float,
    retry: RetrySettings,
    attempt: int = 0,
) -> tuple[CompleteAnswer, str | None]:
    """Finish a task leased to the session's daemon. Returns the response body and the instance
    id that changed. A task outside the session's namespaces is not found; one leased to
    another daemon is a 409, and so is one from an expired lease or, when the daemon sends the
    ``attempt`` it claimed (the lease's epoch), from an earlier lease of the same daemon."""
    daemon_id = session.daemon_id
    lock = for_update(conn)  # a constant fragment
    row = conn.execute("SELECT * FROM tasks WHERE task_id = ?" + lock, (task_id,)).fetchone()  # noqa: S608
    if row is None or not session_may_act(session, row):
        raise NotFound(
            f"no task {task_id!r}: complete only task ids returned by claim", code="task_not_found"
        )
    if row["status"] in FINISHED_STATUSES and row["lease_owner"] == daemon_id:
        return CompleteAnswer(status=row["status"], duplicate=True), None
    if (
        row["status"] != "leased"
        or row["lease_owner"] != daemon_id
        or (row["lease_expires"] is not None and row["lease_expires"] <= now)
        or (attempt and attempt != row["attempts"])
    ):
        raise Conflict(
            f"daemon {daemon_id!r} no longer holds the lease on task {task_id!r} (it expired, was "
            "released or went to another daemon): drop this result",
            code="lease_lost",
        )
    instance_id: str | None = row["instance_id"]
    kind = row["kind"]
    changed = False
    error_text = (error or "task failed")[:_MAX_ERROR_CHARS]
    if ok:
        conn.execute(
            "UPDATE tasks SET status = 'done', result = ?, error = NULL, finished_at = ?, "
            "updated_at = ?, lease_expires = NULL WHERE seq = ?",
            (json.dumps(result) if result is not None else None, now, now, row["seq"]),
        )
        # A Pod is pinned to its daemon's node; a dockyard launch's objects are not, so its
        # instance keeps no node and any daemon serving its namespace may take its stop task.
        # Either way the instance is bound to the daemon that applied it (its reports, logs
        # and results are accepted from it alone, see queue.sql.binding).
        if kind in START_KINDS and instance_id:
            binding.record_applied(conn, instance_id=instance_id, session=session, pinned=kind == "launch")
        if kind == "launch" and instance_id:
            inst = fetch_instance(conn, instance_id)
            if session.node and inst is not None and inst["node"] is None:
                changed = transition(conn, instance_id=instance_id, now=now, node=session.node, row=inst)
        elif kind == "stop" and instance_id and placement.is_move(conn, stop_task_id=task_id):
            # It cleared a node the launch was Unschedulable on; the launch waits for another.
            cur = conn.execute(
                "UPDATE instances SET node = NULL WHERE instance_id = ? AND node IS NOT NULL", (instance_id,)
            )
            if cur.rowcount:
                events.record(conn, instance_id=instance_id, changes=[events.NODE], at=now)
        elif kind == "stop" and instance_id:
            changed = transition(
                conn,
                instance_id=instance_id,
                now=now,
                state=InstanceState.STOPPED.value,
                reason=Reason.STOPPED.value,
                message="stopped on request",
            )
        body = CompleteAnswer(status="done")
    elif kind == "launch" and instance_id and _stop_requested(conn, instance_id):
        # The user asked to stop it: do not try again; the stop task ordered after this one
        # cleans up whatever exists and ends the instance.
        conn.execute(
            "UPDATE tasks SET status = 'cancelled', error = ?, finished_at = ?, updated_at = ?, "
            "lease_expires = NULL WHERE seq = ?",
            (error_text, now, now, row["seq"]),
        )
        body = CompleteAnswer(status="cancelled")
    elif retryable and row["attempts"] < retry.max_attempts:
        not_before = now + retry.backoff(row["attempts"])
        conn.execute(
            "UPDATE tasks SET status = 'pending', last_owner = lease_owner, lease_owner = NULL, lease_expires = NULL, "
            "not_before = ?, error = ?, updated_at = ? WHERE seq = ?",
            (not_before, error_text, now, row["seq"]),
        )
        body = CompleteAnswer(status="requeued", notBefore=iso(not_before))
    else:
        conn.execute(
            "UPDATE tasks SET status = 'failed', error = ?, result = ?, finished_at = ?, "
            "updated_at = ?, lease_expires = NULL WHERE seq = ?",
            (error_text, json.dumps(result) if result is not None else None, now, now, row["seq"]),
        )
        if kind in START_KINDS and instance_id:
            changed = transition(
                conn,
                instance_id=instance_id,
                now=now,
                state=InstanceState.STOPPED.value,
                reason=Reason.LAUNCH_FAILED.value,
                message=error_text,
            )
        body = CompleteAnswer(status="failed")
    return body, instance_id if changed else None


def sweep(conn: Conn, *, now: float) -> tuple[int, set[str]]:
    """Settle what :func:`retire` settles, then hand expired leases back; returns how many were
    handed back and the instances that changed."""
    settled = retire(conn, now=now)
    cur = conn.execute(
        "UPDATE tasks SET status = 'pending', last_owner = lease_owner, lease_owner = NULL, lease_expires = NULL, "
        "updated_at = ? WHERE status = 'leased' AND lease_expires <= ?",
        (now, now),
    )
    placement.update_waiting(conn, now=now)
    return cur.rowcount, settled
