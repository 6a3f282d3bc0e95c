"""Launch groups (synchronous SQL inside the caller's transaction on the database thread).

A group is accepted whole or not at all: every launch it stands for
(:func:`nymph.launch.groups.expand`) is built and checked first, as a single launch is
(:func:`nymph.queue.sql.launches.build_spec`; a launch identical to one already checked is not
rendered again), then its instances, their first history entries and their tasks (daemon path)
or Pod records (direct path: created in turn by the release of held launches) go in as bulk
inserts. An Idempotency-Key makes the whole group idempotent (the first 202 body again).
A group's stop stops each of its instances as a single stop does.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from nymph.errors import ValidationError
from nymph.launch.config import Provider, connection_kwargs
from nymph.launch.groups import expand, new_group_id
from nymph.launch.render import render_pod
from nymph.launch.spec import LaunchSpec
from nymph.launch.state import InstanceState, Reason
from nymph.protocol import LaunchAccepted, iso
from nymph.queue.errors import BadRequest, Conflict, NotFound, ServiceError
from nymph.queue.sql import catalog, events, idempotency, instances, launches, retries
from nymph.queue.sql.dialect import Conn, Row
from nymph.queue.sql.rows import INSTANCE_COLUMNS, fetch_instance
from nymph.queue.sql.tasks import insert_launch_tasks
from nymph.queue.sql.transitions import transition

_CHUNK = 500
#: The message of a direct group launch until its Pod is created.
HELD_MESSAGE = "waiting for its Pod to be created (launched in a group)"


@dataclasses.dataclass(frozen=True)
class GroupAcceptance:
    """The 202 body, and for a new group (not a replay) how many launches it queued for
    daemons (0 on the direct path)."""

    accepted: dict[str, Any]
    tasks: int = 0
    created: bool = False


def _specs(
    conn: Conn,
    *,
    ns: str,
    provider: Provider,
    items: list[dict[str, Any]],
    guard: launches.Guard | None,
    named: bool,
) -> list[LaunchSpec]:
    """A spec per item, each built and checked (identical items once); errors name the item
    when ``named`` (a group of ``items``, not of ``count`` copies)."""
    built: dict[str, LaunchSpec] = {}
    modes: dict[str, Any] = {}
    out = []
    for i, item in enumerate(items):
        digest = idempotency.body_digest(item)
        spec = built.get(digest)
        if spec is None:
            try:
                name = str(item["mode"])
                if name not in modes:
                    modes[name] = catalog.mode_for(conn, ns=ns, provider=provider, mode_name=name)
                spec = launches.build_spec(
                    provider=provider,
                    mode=modes[name],
                    body={k: v for k, v in item.items() if k != "mode"},
                    ns=ns,
                    guard=guard,
                )
                spec = launches.runtime_limited(conn, spec, ns=ns)
            except ServiceError as exc:
                exc.detail = f"items[{i}]: {exc.detail}" if named else exc.detail
                raise
            built[digest] = spec
        out.append(spec)
    return out


def _fresh_ids(conn: Conn, count: int) -> list[str]:
    """``count`` new instance ids, none taken yet (ids are never reused)."""
    ids: list[str] = []
    while len(ids) < count:
        want = {launches.new_instance_id() for _ in range(count - len(ids))} - set(ids)
        taken: set[str] = set()
        batch = sorted(want)
        for start in range(0, len(batch), _CHUNK):
            chunk = batch[start : start + _CHUNK]
            marks = ",".join("?" * len(chunk))
            taken |= {
                r[0]
                for r in conn.execute(
                    f"SELECT instance_id FROM instances WHERE instance_id IN ({marks})",  # noqa: S608
                    chunk,
                )
            }
        ids.extend(sorted(want - taken))
    return ids[:count]


def accept_group(
    conn: Conn,
    *,
    ns: str,
    provider_name: str,
    body: Mapping[str, Any],
    idempotency_key: str | None,
    requester: str,
    ts: float,
    guard: launches.Guard | None = None,
    image_pull_timeout: int | None = None,
) -> GroupAcceptance:
    """Accept a launch group on the provider's dispatch path (see the module docstring)."""
    digest = idempotency.body_digest({"group": body})
    replay = idempotency.replay_json(conn, ns=ns, provider=provider_name, key=idempotency_key, digest=digest)
    if replay is not None:
        return GroupAcceptance(accepted=replay)
    try:
        items = expand(body)
    except ValidationError as exc:
        raise BadRequest(str(exc), code="invalid_launch") from None
    provider = catalog.get_provider(conn, ns=ns, name=provider_name)
    group_id = new_group_id()
    specs = []
    for i, (spec, iid) in enumerate(
        zip(
            _specs(conn, ns=ns, provider=provider, items=items, guard=guard, named="items" in body),
            _fresh_ids(conn, len(items)),
            strict=True,
        )
    ):
        if spec.image_pull_timeout is None and image_pull_timeout is not None:
            spec = dataclasses.replace(spec, image_pull_timeout=image_pull_timeout)
        specs.append(
            dataclasses.replace(
                spec, instance_id=iid, launch_uid=launches.new_launch_uid(), group_id=group_id, group_index=i
            )
        )
    cur = conn.executemany(
        "INSERT INTO instances (instance_id, namespace, provider, kube_namespace, state, reason, "
        "message, node, launched_at, updated_at, version, requester, group_id, group_index) "
        "VALUES (?, ?, ?, ?, 'queued', NULL, '', NULL, ?, ?, 1, ?, ?, ?) ON CONFLICT (instance_id) DO NOTHING",
        [
            (s.instance_id, ns, provider.name, s.namespace, ts, ts, requester, group_id, s.group_index)
            for s in specs
        ],
    )
    if cur.rowcount != len(specs):  # another replica took an id meanwhile
        raise Conflict(
            "an instance id was taken while the group was accepted: send it again", code="instance_id_taken"
        )
    conn.executemany(
        "INSERT INTO instance_events (instance_id, state, reason, message, at) VALUES (?, 'queued', NULL, '', ?)",
        [(s.instance_id, ts) for s in specs],
    )
    events.record_created(
        conn,
        ns=ns,
        provider=provider.name,
        group=group_id,
        instance_ids=[s.instance_id for s in specs],
        at=ts,
    )
    conn.execute(
        "INSERT INTO launch_groups (group_id, namespace, provider, total, requester, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (group_id, ns, provider.name, len(specs), requester, ts),
    )
    retries.remember_policies(conn, specs=specs)
    tasks = 0
    if provider.direct:
        _record_direct(conn, ns=ns, provider=provider, specs=specs, items=items)
    else:
        tasks = insert_launch_tasks(
            conn,
            ns=ns,
            provider=provider.name,
            specs=[s.to_json() for s in specs],
            requester=requester,
            ts=ts,
        )
    accepted = {
        "groupId": group_id,
        "providerName": provider.name,
        "total": len(specs),
        "instances": [
            LaunchAccepted(
                instanceId=s.instance_id,
                state=InstanceState.QUEUED.value,
                providerName=provider.name,
                launchedAt=iso(ts),
            )
            for s in specs
        ],
    }
    idempotency.remember_json(
        conn,
        ns=ns,
        provider=provider_name,
        key=idempotency_key,
        digest=digest,
        owner=group_id,
        response=accepted,
        ts=ts,
    )
    return GroupAcceptance(accepted=accepted, tasks=tasks, created=True)


def _record_direct(
    conn: Conn, *, ns: str, provider: Provider, specs: list[LaunchSpec], items: list[dict[str, Any]]
) -> None:
    """Direct group launches are recorded held (their Pods are created in turn, as a quota's
    held launches are, by the queue's release of held launches)."""
    modes: dict[str, Any] = {}
    rows = []
    for spec, item in zip(specs, items, strict=True):
        name = str(item["mode"])
        if name not in modes:
            modes[name] = catalog.mode_for(conn, ns=ns, provider=provider, mode_name=name)
        connection = {**connection_kwargs(provider, modes[name]), "namespace": spec.namespace}
        rows.append((json.dumps(connection), json.dumps(render_pod(spec)), HELD_MESSAGE, spec.instance_id))
    conn.executemany(
        "UPDATE instances SET dispatch = 'direct', connection = ?, pod = ?, charge = NULL, message = ? "
        "WHERE instance_id = ?",
        rows,
    )


def group_row(conn: Conn, *, ns: str, group_id: str) -> Row:
    row: Row | None = conn.execute("SELECT * FROM launch_groups WHERE group_id = ?", (group_id,)).fetchone()
    if row is None or row["namespace"] != ns:
        raise NotFound(f"no launch group {group_id!r} in namespace {ns!r}", code="group_not_found")
    return row


def group_json(conn: Conn, *, ns: str, group_id: str) -> dict[str, Any]:
    """The group with its members counted by state and by reason (each launch's latest attempt)."""
    row = group_row(conn, ns=ns, group_id=group_id)
    counts: dict[str, int] = {}
    reasons: dict[str, int] = {}
    for r in conn.execute(
        "SELECT state, reason, COUNT(*) AS n FROM instances WHERE group_id = ? AND retried_as IS NULL "
        "GROUP BY state, reason",
        (group_id,),
    ):
        counts[r["state"]] = counts.get(r["state"], 0) + int(r["n"])
        if r["reason"]:
            reasons[r["reason"]] = reasons.get(r["reason"], 0) + int(r["n"])
    out: dict[str, Any] = {
        "groupId": group_id,
        "provider": row["provider"],
        "namespace": ns,
        "total": int(row["total"]),
        "counts": dict(sorted(counts.items())),
        "reasons": dict(sorted(reasons.items())),
        "createdAt": iso(row["created_at"]),
        "requester": row["requester"],
    }
    if row["stop_requested_at"] is not None:
        out["stopRequestedAt"] = iso(row["stop_requested_at"])
    return out


def group_page_query(*, group_id: str, after: tuple[Any, ...] | None, limit: int) -> tuple[str, list[Any]]:
    """One page of a group's instances, by place in the group then attempt."""
    sql = f"SELECT {INSTANCE_COLUMNS} FROM instances WHERE group_id = ?"  # noqa: S608
    params: list[Any] = [group_id]
    if after is not None:
        sql += " AND (group_index, attempt) > (?, ?)"
        params.extend(after)
    params.append(limit + 1)
    return sql + " ORDER BY group_index, attempt LIMIT ?", params


@dataclasses.dataclass(frozen=True)
class GroupStop:
    """What a group's stop did: the instances that changed, how many stop tasks it queued, and
    the direct instances whose Pods the caller deletes (provider, instance id)."""

    changed: tuple[str, ...]
    tasks: int
    direct: tuple[tuple[str, str], ...]


def stop_group(conn: Conn, *, ns: str, group_id: str, requester: str, now: float) -> GroupStop:
    """Stop every instance of the group not stopped yet (a second stop finds less or nothing to
    do); its launches not retried from now on."""
    row = group_row(conn, ns=ns, group_id=group_id)
    if row["stop_requested_at"] is None:
        conn.execute("UPDATE launch_groups SET stop_requested_at = ? WHERE group_id = ?", (now, group_id))
    changed: list[str] = []
    direct: list[tuple[str, str]] = []
    tasks = 0
    live = conn.execute(
        "SELECT instance_id, provider, state, dispatch, charge FROM instances "
        "WHERE group_id = ? AND state != 'stopped' ORDER BY group_index, attempt",
        (group_id,),
    ).fetchall()
    for r in live:
        iid = r["instance_id"]
        if r["dispatch"] != "direct":
            was_changed, queued = instances.stop(
                conn, ns=ns, provider=r["provider"], instance_id=iid, grace=None, requester=requester
            )
            tasks += int(queued)
            if was_changed:
                changed.append(iid)
        elif r["state"] == InstanceState.QUEUED.value and r["charge"] is None:
            # held: its Pod was never created (and the release of held launches skips it now)
            conn.execute("UPDATE instances SET stop_requested_at = ? WHERE instance_id = ?", (now, iid))
            if transition(
                conn,
                instance_id=iid,
                now=now,
                state=InstanceState.STOPPED.value,
                reason=Reason.STOPPED.value,
                message="stopped before its Pod was created",
            ):
                changed.append(iid)
        else:
            direct.append((str(r["provider"]), iid))
    return GroupStop(changed=tuple(changed), tasks=tasks, direct=tuple(direct))


def stop_requested(conn: Conn, *, instance_id: str) -> bool:
    """Whether the instance's own stop or its group's was asked for."""
    inst = fetch_instance(conn, instance_id)
    if inst is None:
        return False
    if inst["stop_requested_at"] is not None:
        return True
    row = conn.execute(
        "SELECT g.stop_requested_at FROM instances i JOIN launch_groups g ON g.group_id = i.group_id "
        "WHERE i.instance_id = ?",
        (instance_id,),
    ).fetchone()
    return row is not None and row[0] is not None
