"""Launches, instances, stops, probes and task status (synchronous SQL inside the caller's
transaction on the database thread).

A launch inserts its instance (``queued``), its first history entry and its task together; an
Idempotency-Key remembers the 202 body so a retried launch with the same body gets it again.
"""

from __future__ import annotations

import dataclasses
import functools
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from nymph import fastjson
from nymph.errors import ConfigError, ValidationError
from nymph.launch import names
from nymph.launch.config import Mode, Provider, check_dispatch_kwargs
from nymph.launch.podpolicy import check_pod_spec
from nymph.launch.render import render_pod
from nymph.launch.runlimits import apply_runtime_limits
from nymph.launch.spec import LaunchSpec, build_launch_spec
from nymph.launch.state import InstanceState
from nymph.protocol import LaunchAccepted, TaskKind, iso, now
from nymph.queue.errors import BadRequest, Conflict, ServiceError
from nymph.queue.scheduling import Quota
from nymph.queue.sql import catalog, events, idempotency, retries
from nymph.queue.sql.dialect import UNIQUE_CONFLICTS, Conn, PgConn, is_postgres, send
from nymph.queue.sql.quotas import get_quota, quota_of
from nymph.queue.sql.tasks import insert_task

PROBE_SCRIPT = "print('nymph probe')\n"
PROBE_IMAGE = "busybox"
#: Fresh instance ids tried when an id is already taken (32 random bits each: a second
#: collision in a row needs billions of instances).
MAX_ID_ATTEMPTS = 8

#: The node and workdir root a launch is test-rendered with when it is accepted (any valid values:
#: the daemon renders with its own).
RENDER_CHECK_NODE = "node"
RENDER_CHECK_ROOT = "/var/lib/nymph"
_ID_TAKEN = "no free instance id after {} attempts: send the launch again"
#: On PostgreSQL a taken id breaks the instances' primary key at the commit (see _new_instance).
UNIQUE_CONFLICTS["instances_pkey"] = (_ID_TAKEN.format("several"), "instance_id_taken")
#: Where fresh instance ids come from (``lakeshore-<8 hex>``); a seam for tests.
new_instance_id = names.new_instance_id


def new_launch_uid() -> str:
    return secrets.token_hex(16)


#: A check of the spec a launch would run (the team's tenancy); raises a ServiceError.
Guard = Callable[[LaunchSpec], None]


def build_spec(
    *, provider: Provider, mode: Mode, body: Mapping[str, Any], ns: str, guard: Guard | None = None
) -> LaunchSpec:
    """The launch's spec, accepted only if its Pod renders exactly as a daemon will render it
    (same limits: nesting, the size of the container command), its mode suits its provider's
    dispatch and ``guard`` accepts it."""
    try:
        check_dispatch_kwargs(provider, mode)
    except ConfigError as exc:
        raise BadRequest(str(exc), code="invalid_launch") from None
    try:
        spec = build_launch_spec(
            provider=provider,
            mode=mode,
            body=body,
            instance_id=new_instance_id(),
            owner_namespace=ns,
            launch_uid=new_launch_uid(),
        )
        pod = render_pod(spec, node=RENDER_CHECK_NODE, workdir_root=RENDER_CHECK_ROOT)
        fastjson.dumps(pod)  # it travels as JSON (and is hashed as JSON): refused here if it cannot
        # what nymph renders is held to the Pod policy too (a rule broken here is nymph's bug,
        # or a mode field that reached the Pod unchecked)
        check_pod_spec(pod["spec"], where=f"Pod/{spec.instance_id} spec", workdir_root=RENDER_CHECK_ROOT)
    except (ValidationError, ConfigError) as exc:
        raise BadRequest(str(exc), code="invalid_launch") from None
    except (RecursionError, TypeError, ValueError) as exc:
        raise BadRequest(
            f"the launch cannot be rendered as a Pod ({exc.__class__.__name__}): check its mode "
            "fields and launch fields",
            code="invalid_launch",
        ) from None
    if guard is not None:
        guard(spec)
    return spec


def runtime_limited(conn: Conn, spec: LaunchSpec, *, ns: str, quota: Quota | None = None) -> LaunchSpec:
    """The spec under its namespace's ``defaultRuntime`` and ``maxRuntime`` (a 400 naming the
    cap when it asks for more); ``quota``: the namespace's, when already read."""
    if quota is None:
        quota = get_quota(conn, ns)
    if quota.max_runtime is None and quota.default_runtime is None:
        return spec
    try:
        return apply_runtime_limits(spec, default=quota.default_runtime, cap=quota.max_runtime)
    except ValidationError as exc:
        raise BadRequest(str(exc), code="invalid_launch") from None


@dataclasses.dataclass(frozen=True)
class Acceptance:
    """What accepting a launch gave: its 202 body, and for a new launch (not an Idempotency-Key
    replay) the spec and the provider and mode it was built from."""

    accepted: LaunchAccepted
    spec: LaunchSpec | None = None
    provider: Provider | None = None
    mode: Mode | None = None


class WrongPath(Exception):
    """A launch sent down the path its provider does not dispatch on (``direct``: the
    provider's), found inside the launch's transaction before anything was written: the caller
    sends it down the other one (:meth:`nymph.queue.dispatcher.Dispatchers.launch`)."""

    def __init__(self, *, direct: bool) -> None:
        super().__init__("the provider dispatches " + ("directly" if direct else "through daemons"))
        self.direct = direct

    def __reduce__(self) -> tuple[Any, ...]:
        # rebuilt from its keyword (a copy for each launch of a batch, see launchbatch)
        return functools.partial(WrongPath, direct=self.direct), ()


def _on_path(provider: Provider, direct: bool | None) -> None:
    if direct is not None and provider.direct != direct:
        raise WrongPath(direct=provider.direct)


#: A launch's provider, its mode and its namespace's quota, in one statement (one row whatever
#: exists: a body is NULL where there is none, and the quota's columns where the namespace has
#: no quota). One statement, not three: on PostgreSQL a plain read, sent before the write's
#: transaction needs to begin, and every statement costs a replica CPU of its own (its
#: parameters, its result, psycopg's pipeline).
LAUNCH_CATALOG = (
    "SELECT (SELECT body FROM providers WHERE namespace = ? AND name = ?) AS provider_body, "
    "(SELECT body FROM modes WHERE namespace = ? AND name = ?) AS mode_body, "
    "q.namespace AS quota_namespace, q.weight, q.max_running, q.resources, q.max_runtime, "
    "q.default_runtime FROM (SELECT 1) AS one LEFT JOIN quotas q ON q.namespace = ?"
)


def launch_catalog(
    conn: Conn, *, ns: str, provider_name: str, mode_name: str
) -> tuple[Provider, Mode, Quota]:
    """The provider, the mode (checked against it) and the namespace's quota a launch is built
    from, read together (:data:`LAUNCH_CATALOG`)."""
    row = conn.execute(LAUNCH_CATALOG, (ns, provider_name, ns, mode_name, ns)).fetchone()
    provider = catalog.provider_from(row["provider_body"], ns=ns, name=provider_name)
    mode = catalog.checked_mode(catalog.mode_from(row["mode_body"], ns=ns, name=mode_name), provider=provider)
    return provider, mode, quota_of(None if row["quota_namespace"] is None else row)


def accept(
    conn: Conn,
    *,
    ns: str,
    provider_name: str,
    body: Mapping[str, Any],
    idempotency_key: str | None,
    requester: str,
    ts: float,
    guard: Guard | None = None,
    image_pull_timeout: int | None = None,
    direct: bool | None = None,
) -> Acceptance:
    """Accept a launch on either dispatch path: the Idempotency-Key replay, or a spec built and
    checked in full, its instance (``queued``, a fresh id on a collision) and the key
    remembered. The two paths differ only after this (a task for a daemon, or a Pod record).
    ``image_pull_timeout`` (the queue's) fills in a spec whose mode names none. ``direct``: the
    path the caller runs; a provider that dispatches the other way raises :class:`WrongPath`
    before anything is written."""
    digest = idempotency.body_digest(body) if idempotency_key is not None else ""
    replay = idempotency.replay(conn, ns=ns, provider=provider_name, key=idempotency_key, digest=digest)
    if replay is not None:
        if direct is not None:
            _on_path(catalog.get_provider(conn, ns=ns, name=provider_name), direct)
        return Acceptance(accepted=replay)
    provider, mode, quota = launch_catalog(
        conn, ns=ns, provider_name=provider_name, mode_name=str(body["mode"])
    )
    _on_path(provider, direct)
    return _accept_from(
        conn,
        Catalog(provider=provider, mode=mode, quota=quota),
        ns=ns,
        provider_name=provider_name,
        body=body,
        idempotency_key=idempotency_key,
        digest=digest,
        requester=requester,
        ts=ts,
        guard=guard,
        image_pull_timeout=image_pull_timeout,
    )


@dataclasses.dataclass(frozen=True)
class Catalog:
    """What a launch is built from (:func:`launch_catalog`)."""

    provider: Provider
    mode: Mode
    quota: Quota


def _accept_from(
    conn: Conn,
    cat: Catalog,
    *,
    ns: str,
    provider_name: str,
    body: Mapping[str, Any],
    idempotency_key: str | None,
    digest: str,
    requester: str,
    ts: float,
    guard: Guard | None,
    image_pull_timeout: int | None,
) -> Acceptance:
    """A launch's spec built and checked in full from ``cat``, its instance inserted and its key
    remembered (see :func:`accept`)."""
    spec = build_spec(
        provider=cat.provider,
        mode=cat.mode,
        body={k: v for k, v in body.items() if k != "mode"},
        ns=ns,
        guard=guard,
    )
    spec = runtime_limited(conn, spec, ns=ns, quota=cat.quota)
    if spec.image_pull_timeout is None and image_pull_timeout is not None:
        spec = dataclasses.replace(spec, image_pull_timeout=image_pull_timeout)
    accepted = _new_instance(
        conn,
        first_id=spec.instance_id,
        ns=ns,
        provider=cat.provider.name,
        kube_ns=spec.namespace,
        requester=requester,
        ts=ts,
    )
    if accepted["instanceId"] != spec.instance_id:  # the first id was taken
        spec = dataclasses.replace(spec, instance_id=accepted["instanceId"])
    retries.remember_policy(conn, spec=spec)
    idempotency.remember(
        conn, ns=ns, provider=provider_name, key=idempotency_key, digest=digest, accepted=accepted, ts=ts
    )
    return Acceptance(accepted=accepted, spec=spec, provider=cat.provider, mode=cat.mode)


def launch(
    conn: Conn,
    *,
    ns: str,
    provider_name: str,
    body: Mapping[str, Any],
    idempotency_key: str | None,
    requester: str,
    guard: Guard | None = None,
    image_pull_timeout: int | None = None,
) -> tuple[LaunchAccepted, dict[str, Any] | None]:
    """A launch for a daemon: accepted, then its task queued. ``(202 body, the task's spec)``,
    the spec None for an Idempotency-Key replay (nothing queued); a provider that dispatches
    directly raises :class:`WrongPath` (nothing written)."""
    ts = now()
    got = accept(
        conn,
        ns=ns,
        provider_name=provider_name,
        body=body,
        idempotency_key=idempotency_key,
        requester=requester,
        ts=ts,
        guard=guard,
        image_pull_timeout=image_pull_timeout,
        direct=False,
    )
    if got.spec is None or got.provider is None:
        return got.accepted, None
    return got.accepted, _queue_task(conn, got.spec, ns=ns, provider=got.provider, requester=requester, ts=ts)


def _queue_task(
    conn: Conn, spec: LaunchSpec, *, ns: str, provider: Provider, requester: str, ts: float
) -> dict[str, Any]:
    """The launch's task for a daemon, queued: its spec as the task holds it."""
    task_spec = spec.to_json()
    insert_task(
        conn,
        kind=TaskKind.LAUNCH.value,
        ns=ns,
        kube_ns=spec.namespace,
        provider=provider.name,
        instance_id=spec.instance_id,
        spec=task_spec,
        requester=requester,
        ts=ts,
    )
    return task_spec


@dataclasses.dataclass(frozen=True)
class BatchLaunch:
    """One launch of a batch (:func:`launch_batch`): its body, who sent it and their tenancy
    check; no Idempotency-Key (a keyed launch reads its key first and goes alone)."""

    body: Mapping[str, Any]
    requester: str
    guard: Guard | None = None


#: A batch launch's outcome: its 202 body and its task's spec, or the error that is its answer.
BatchOutcome = tuple[LaunchAccepted, dict[str, Any]] | ServiceError


def launch_batch(
    conn: Conn,
    *,
    ns: str,
    provider_name: str,
    mode_name: str,
    items: Sequence[BatchLaunch],
    image_pull_timeout: int | None = None,
) -> list[BatchOutcome]:
    """Launches for daemons of one namespace, provider and mode, accepted in one transaction:
    the catalog read once (a provider or mode that is missing, or dispatches directly, raises:
    that is every launch's answer), then each launch built, checked and queued as
    :func:`launch` does. The rows of them all go with the commit, each table's rows as one
    insert (:func:`~nymph.queue.sql.dialect._merged`): a batch costs the round trips of one
    launch. A launch refused (its spec: a 400, its team's tenancy: a 403) has its error as its
    outcome and leaves nothing written; the others go on. Its outcomes are in ``items``' order.

    A launch that raises anything else, or that is refused after a statement of its own ran,
    ends the batch (the exception is raised, nothing is committed): the caller then sends each
    launch alone."""
    provider, mode, quota = launch_catalog(conn, ns=ns, provider_name=provider_name, mode_name=mode_name)
    _on_path(provider, False)
    cat = Catalog(provider=provider, mode=mode, quota=quota)
    out: list[BatchOutcome] = []
    pg = conn if isinstance(conn, PgConn) else None  # on SQLite a statement runs when sent
    for item in items:
        ts = now()
        mark = pg.mark() if pg is not None else None
        try:
            got = _accept_from(
                conn,
                cat,
                ns=ns,
                provider_name=provider_name,
                body=item.body,
                idempotency_key=None,
                digest="",
                requester=item.requester,
                ts=ts,
                guard=item.guard,
                image_pull_timeout=image_pull_timeout,
            )
        except ServiceError as exc:
            if pg is None or mark is None or not pg.undo(mark):
                raise
            out.append(exc)
            continue
        assert got.spec is not None
        task_spec = _queue_task(conn, got.spec, ns=ns, provider=provider, requester=item.requester, ts=ts)
        out.append((got.accepted, task_spec))
    return out


def launch_dockyard(
    conn: Conn,
    *,
    ns: str,
    provider_name: str,
    body: Mapping[str, Any],
    kube_ns: str,
    idempotency_key: str | None,
    requester: str,
    guard: Guard | None = None,
    max_runtime: int | None = None,
) -> tuple[LaunchAccepted, bool]:
    """Queue a dockyard launch whose spec the route rendered and accepted for ``kube_ns``
    (``max_runtime``: the RayJob's deadline, from the namespace's runtime limits)."""
    digest = idempotency.body_digest({"dockyard": body})
    replay = idempotency.replay(conn, ns=ns, provider=provider_name, key=idempotency_key, digest=digest)
    if replay is not None:
        return replay, False
    provider = catalog.get_provider(conn, ns=ns, name=provider_name)
    if catalog.kube_namespace(provider) != kube_ns:
        raise Conflict(
            f"provider {provider_name!r} changed its kube namespace while this launch was being "
            "checked: send it again",
            code="provider_changed",
        )
    ts = now()
    accepted = _new_instance(
        conn,
        first_id=new_instance_id(),
        ns=ns,
        provider=provider.name,
        kube_ns=kube_ns,
        requester=requester,
        ts=ts,
    )
    instance_id = accepted["instanceId"]
    insert_task(
        conn,
        kind=TaskKind.DOCKYARD.value,
        ns=ns,
        kube_ns=kube_ns,
        provider=provider.name,
        instance_id=instance_id,
        spec={**body, "namespace": kube_ns, **({} if max_runtime is None else {"maxRuntime": max_runtime})},
        requester=requester,
        ts=ts,
    )
    idempotency.remember(
        conn, ns=ns, provider=provider_name, key=idempotency_key, digest=digest, accepted=accepted, ts=ts
    )
    return accepted, True


_INSERT_INSTANCE = (
    "INSERT INTO instances (instance_id, namespace, provider, kube_namespace, state, "
    "reason, message, node, launched_at, updated_at, version, requester) "
    "VALUES (?, ?, ?, ?, ?, NULL, '', NULL, ?, ?, 1, ?)"
)


def _new_instance(
    conn: Conn,
    *,
    first_id: str,
    ns: str,
    provider: str,
    kube_ns: str,
    requester: str,
    ts: float,
) -> LaunchAccepted:
    """Insert a queued instance under ``first_id``, or, when that id is taken (ids are never
    reused: old instances stay), under a fresh one; the answer carries the id used."""
    instance_id = first_id
    if is_postgres(conn):
        # Sent with the commit, not a round trip of its own: a taken id (32 random bits) breaks
        # the primary key there, and the whole write runs again with fresh ids (pgdb).
        send(
            conn,
            _INSERT_INSTANCE,
            (instance_id, ns, provider, kube_ns, InstanceState.QUEUED.value, ts, ts, requester),
        )
    else:
        for attempt in range(MAX_ID_ATTEMPTS):
            if attempt:
                instance_id = new_instance_id()
            cur = conn.execute(
                _INSERT_INSTANCE + " ON CONFLICT (instance_id) DO NOTHING",
                (instance_id, ns, provider, kube_ns, InstanceState.QUEUED.value, ts, ts, requester),
            )
            if cur.rowcount:
                break
        else:
            raise Conflict(_ID_TAKEN.format(MAX_ID_ATTEMPTS), code="instance_id_taken")
    send(
        conn,
        "INSERT INTO instance_events (instance_id, state, reason, message, at) VALUES (?, ?, NULL, '', ?)",
        (instance_id, InstanceState.QUEUED.value, ts),
    )
    events.record_created(conn, ns=ns, provider=provider, group=None, instance_ids=[instance_id], at=ts)
    return LaunchAccepted(
        instanceId=instance_id,
        state=InstanceState.QUEUED.value,
        providerName=provider,
        launchedAt=iso(ts),
    )


def probe(
    conn: Conn,
    *,
    ns: str,
    provider_name: str,
    mode_name: str | None,
    requester: str,
    guard: Guard | None = None,
) -> str:
    provider = catalog.get_provider(conn, ns=ns, name=provider_name)
    if mode_name is not None:
        mode = catalog.mode_for(conn, ns=ns, provider=provider, mode_name=mode_name)
    else:
        mode = Mode(name="probe", provider=provider.name, fields={"image": PROBE_IMAGE})
    spec = build_spec(
        provider=provider,
        mode=mode,
        body={"script": PROBE_SCRIPT, "tags": {"nymph-probe": "true"}},
        ns=ns,
        guard=guard,
    )
    return insert_task(
        conn,
        kind=TaskKind.PROBE.value,
        ns=ns,
        kube_ns=spec.namespace,
        provider=provider.name,
        instance_id=spec.instance_id,
        spec=spec.to_json(),
        requester=requester,
        ts=now(),
    )
