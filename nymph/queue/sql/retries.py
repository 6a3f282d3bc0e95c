"""Retries: a launch with a retry policy that stops is launched again, as a new attempt with its
own instance (synchronous SQL, called by :func:`nymph.queue.sql.transitions.transition` inside
the transaction that stops the instance).

That is what makes a retry exactly-once per attempt: the new attempt is written in the same
transaction as the old one's terminal state, and a stopped instance never changes again, so a
redelivered report or completion, or a daemon or queue that dies between the two, can never make
a second one. The policy decides (:func:`nymph.launch.retry.decide`); both instances' histories
say what it decided and why (the rule that matched, or why none did). The new attempt carries
``retryOf`` and ``attempt``, the old one ``retriedAs``; it keeps the launch's group and place in
it, and it is queued as a new launch (the scheduler orders it as any other: priority, fair
share, quota), after the policy's backoff. On the direct path it is recorded held, and its Pod
is created by the release of held launches once its backoff is over.
"""

from __future__ import annotations

import json
from typing import Any

from nymph.launch import retry
from nymph.launch.render import render_pod
from nymph.launch.spec import LaunchSpec
from nymph.launch.state import InstanceState
from nymph.queue.sql import events, launches
from nymph.queue.sql.dialect import Conn, Row
from nymph.queue.sql.quotas import get_quota
from nymph.queue.sql.tasks import insert_task

_STOPPED = InstanceState.STOPPED.value


def _note(conn: Conn, *, instance_id: str, reason: str | None, message: str, now: float) -> None:
    """An entry in the instance's history saying what its retry policy decided."""
    conn.execute(
        "INSERT INTO instance_events (instance_id, state, reason, message, at) VALUES (?, ?, ?, ?, ?)",
        (instance_id, _STOPPED, reason, message[:4096], now),
    )


def _group_stopped(conn: Conn, group_id: str | None) -> bool:
    if group_id is None:
        return False
    row = conn.execute(
        "SELECT stop_requested_at FROM launch_groups WHERE group_id = ?", (group_id,)
    ).fetchone()
    return row is not None and row[0] is not None


def _fresh_id(conn: Conn) -> str:
    for _ in range(launches.MAX_ID_ATTEMPTS):
        candidate = launches.new_instance_id()
        if conn.execute("SELECT 1 FROM instances WHERE instance_id = ?", (candidate,)).fetchone() is None:
            return candidate
    raise RuntimeError("no free instance id for a retry")  # 32 random bits, 8 times in a row


def _memory_cap(conn: Conn, ns: str) -> int | None:
    limit = get_quota(conn, ns).resources.get("memory")
    return None if limit is None else int(limit)


def _avoid_affinity(pod: dict[str, Any], nodes: list[str]) -> None:
    """Keep a direct Pod off ``nodes`` (a required node affinity term)."""
    term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": nodes}]}
    affinity = pod["spec"].setdefault("affinity", {}).setdefault("nodeAffinity", {})
    required = affinity.setdefault(
        "requiredDuringSchedulingIgnoredDuringExecution", {"nodeSelectorTerms": []}
    )
    terms = required["nodeSelectorTerms"] or [{}]
    for t in terms:
        t.setdefault("matchExpressions", []).extend(term["matchExpressions"])
    required["nodeSelectorTerms"] = terms


def after_stop(conn: Conn, *, row: Row, reason: str | None, node: str | None, now: float) -> str | None:
    """The instance ``row`` (as it was before it stopped) has just stopped with ``reason`` on
    ``node``: launch its next attempt if its policy says so. Returns the new instance id, or None."""
    iid = row["instance_id"]
    if (
        row["retried_as"] is not None
        or row["stop_requested_at"] is not None
        or _group_stopped(conn, row["group_id"])
    ):
        return None  # retried already, or stopped on request
    stored = conn.execute(
        "SELECT retry, dispatch, connection FROM instances WHERE instance_id = ?", (iid,)
    ).fetchone()
    spec = json.loads(stored["retry"])
    policy = retry.parse_policy(spec.get("retry"), "spec.retry")
    if policy is None:
        return None
    attempt = int(row["attempt"] or 1)
    exit_code = None if row["exit_code"] is None else int(row["exit_code"])
    decision = retry.decide(policy, attempt=attempt, reason=reason, exit_code=exit_code)
    if not decision.retry:
        if reason in retry.RETRY_REASONS:
            _note(conn, instance_id=iid, reason=reason, message=decision.why, now=now)
        return None
    new_id = _fresh_id(conn)
    new_spec: dict[str, Any] = {
        **spec,
        "instanceId": new_id,
        "launchUid": launches.new_launch_uid(),
        "retryOf": iid,
        "attempt": attempt + 1,
    }
    done: list[str] = []
    if decision.memory_factor is not None:
        scaled = retry.scale_memory(
            new_spec.get("resources"), decision.memory_factor, cap=_memory_cap(conn, row["namespace"])
        )
        if scaled is not None:
            new_spec["resources"] = scaled
            done.append(f"memory x{decision.memory_factor:g} (capped by the namespace quota)")
    if decision.avoid_node and node:
        new_spec["avoidNodes"] = sorted({*new_spec.get("avoidNodes", ()), node})
        done.append(f"not on node {node}")
    total = policy.limit + 1
    why = (
        decision.why
        + (f"; {', '.join(done)}" if done else "")
        + (f"; after {decision.delay}s" if decision.delay else "")
    )
    direct = stored["dispatch"] == "direct"
    starts = now + decision.delay
    # The attempt's one retry is claimed first: a concurrent writer that got here too (it waited
    # on this row) finds it taken and makes none.
    claimed = conn.execute(
        "UPDATE instances SET retried_as = ?, version = version + 1 WHERE instance_id = ? AND retried_as IS NULL",
        (new_id, iid),
    )
    if not claimed.rowcount:
        return None
    conn.execute(
        "INSERT INTO instances (instance_id, namespace, provider, kube_namespace, state, reason, message, node, "
        "launched_at, updated_at, version, requester, group_id, group_index, attempt, retry_of, retry) "
        "VALUES (?, ?, ?, ?, 'queued', NULL, '', NULL, ?, ?, 1, ?, ?, ?, ?, ?, ?)",
        (
            new_id,
            row["namespace"],
            row["provider"],
            row["kube_namespace"],
            starts if direct else now,
            now,
            row["requester"],
            row["group_id"],
            row["group_index"],
            attempt + 1,
            iid,
            json.dumps(new_spec),
        ),
    )
    conn.execute(
        "INSERT INTO instance_events (instance_id, state, reason, message, at) VALUES (?, 'queued', NULL, ?, ?)",
        (new_id, f"attempt {attempt + 1} of {total}, retrying {iid} ({reason}): {why}", now),
    )
    events.record(conn, instance_id=new_id, changes=[events.CREATED, events.STATE, events.ATTEMPT], at=now)
    _note(
        conn,
        instance_id=iid,
        reason=reason,
        message=f"retried as {new_id} (attempt {attempt + 1} of {total}): {why}",
        now=now,
    )
    if direct:
        pod: dict[str, Any] = json.loads(json.dumps(render_pod(LaunchSpec.from_json(new_spec))))
        if new_spec.get("avoidNodes"):
            _avoid_affinity(pod, list(new_spec["avoidNodes"]))
        conn.execute(
            "UPDATE instances SET dispatch = 'direct', connection = ?, pod = ?, charge = NULL, message = ? "
            "WHERE instance_id = ?",
            (
                stored["connection"],
                json.dumps(pod),
                f"a retry of {iid}: its Pod is created when its turn comes",
                new_id,
            ),
        )
    else:
        insert_task(
            conn,
            kind="launch",
            ns=row["namespace"],
            kube_ns=row["kube_namespace"],
            provider=row["provider"],
            instance_id=new_id,
            spec=new_spec,
            requester=row["requester"],
            ts=now,
            not_before=starts if decision.delay else 0.0,
        )
    return new_id


def remember_policies(conn: Conn, *, specs: list[LaunchSpec]) -> None:
    """:func:`remember_policy` for many launches, in one bulk update."""
    rows = [(json.dumps(s.to_json()), s.instance_id) for s in specs if s.retry is not None]
    if rows:
        conn.executemany("UPDATE instances SET retry = ? WHERE instance_id = ?", rows)


def remember_policy(conn: Conn, *, spec: LaunchSpec) -> None:
    """Keep what a next attempt of this launch needs (its spec, with its policy), only for a
    launch that has a retry policy."""
    if spec.retry is not None:
        conn.execute(
            "UPDATE instances SET retry = ? WHERE instance_id = ?",
            (json.dumps(spec.to_json()), spec.instance_id),
        )
