"""Task rows: their ids and one insert every kind of task goes through (synchronous SQL inside
the caller's transaction), which files a launch under its scheduling group and priority."""

from __future__ import annotations

import secrets
from typing import Any

from nymph import fastjson
from nymph.queue.sql.dialect import Conn, send
from nymph.queue.sql.schedule import group_of, priority_of


def spec_text(spec: dict[str, Any]) -> str:
    """A task's spec as stored (:func:`nymph.fastjson.dumps_text`: a launch's spec is encoded
    at every launch). A spec holds no NaN, infinity or lone surrogate (which orjson would not
    keep): a request body with one is refused (:func:`nymph.queue.http.bodies.read_object`)."""
    return fastjson.dumps_text(spec)


def new_task_id() -> str:
    return "task-" + secrets.token_hex(8)


def insert_task(
    conn: Conn,
    *,
    kind: str,
    ns: str,
    kube_ns: str,
    provider: str,
    instance_id: str | None,
    spec: dict[str, Any] | None,
    requester: str,
    ts: float,
    after: str | None = None,
    grace: int | None = None,
    not_before: float = 0.0,
) -> str:
    """Insert a pending task (``not_before``: not handed out before then, e.g. a retry's backoff)."""
    task_id = new_task_id()
    send(
        conn,
        "INSERT INTO tasks (task_id, kind, status, namespace, kube_namespace, provider, "
        "instance_id, spec, requester, after_task, grace_period, created_at, updated_at, grp, priority, "
        "not_before) VALUES (?, ?, 'pending', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            task_id,
            kind,
            ns,
            kube_ns,
            provider,
            instance_id,
            spec_text(spec) if spec is not None else None,
            requester,
            after,
            grace,
            ts,
            ts,
            group_of(kind=kind, namespace=ns, kube_namespace=kube_ns, spec=spec),
            priority_of(spec),
            not_before,
        ),
    )
    return task_id


def insert_launch_tasks(
    conn: Conn, *, ns: str, provider: str, specs: list[dict[str, Any]], requester: str, ts: float
) -> int:
    """One ``launch`` task per spec (JSON, each with its ``instanceId`` and ``namespace``) in one
    bulk insert, filed as :func:`insert_task` files each; returns how many."""
    rows = [
        (
            new_task_id(),
            "launch",
            ns,
            spec["namespace"],
            provider,
            spec["instanceId"],
            spec_text(spec),
            requester,
            ts,
            ts,
            group_of(kind="launch", namespace=ns, kube_namespace=spec["namespace"], spec=spec),
            priority_of(spec),
        )
        for spec in specs
    ]
    conn.executemany(
        "INSERT INTO tasks (task_id, kind, status, namespace, kube_namespace, provider, "
        "instance_id, spec, requester, created_at, updated_at, grp, priority) "
        "VALUES (?, ?, 'pending', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        rows,
    )
    return len(rows)
