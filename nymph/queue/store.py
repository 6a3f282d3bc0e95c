"""The queue's state in SQLite, behind async methods.

Each method is one transaction on the database thread (see :mod:`nymph.queue.db`); after a
commit that can make a task claimable or change an instance, the matching long-polls are woken
(:mod:`nymph.queue.notify`). User-side SQL lives here; dispatch-side SQL in
:mod:`nymph.queue.leases`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

import structlog

from nymph.dockyard.errors import DockyardConfigError
from nymph.dockyard.render.task import dockyard_task_manifests
from nymph.errors import ConfigError, ValidationError
from nymph.launch.config import Mode, Provider
from nymph.launch.names import check_namespace, new_instance_id
from nymph.launch.spec import LaunchSpec, build_launch_spec
from nymph.launch.state import InstanceState, Reason
from nymph.queue import leases
from nymph.queue.db import Database
from nymph.queue.errors import BadRequest, Conflict, NotFound
from nymph.queue.models import (
    START_KINDS,
    ActiveJSON,
    ClaimRequest,
    ClaimResult,
    DaemonJSON,
    InstanceJSON,
    LaunchAccepted,
    Principal,
    QueueSettings,
    Report,
    TaskKind,
    TaskStatusJSON,
    iso,
    now,
)
from nymph.queue.notify import KeyedSignal, Signal
from nymph.queue.rows import (
    INSTANCE_COLUMNS,
    fetch_instance,
    instances_json,
    task_status_json,
    transition,
)

log = structlog.get_logger(__name__, component="queue.store")

PROBE_SCRIPT = "print('nymph probe')\n"
PROBE_IMAGE = "busybox"


def new_task_id() -> str:
    return "task-" + secrets.token_hex(8)


def body_digest(body: Mapping[str, Any]) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8", errors="surrogatepass")).hexdigest()


def check_dockyard(spec: Mapping[str, Any]) -> None:
    """Render a dockyard task spec exactly as the daemon will (pure, CPU only); raises
    :class:`BadRequest` with the renderer's one-line message (file, key path, what is allowed)."""
    try:
        dockyard_task_manifests(
            recipe=spec["recipe"],
            infra=spec["infra"],
            overrides=spec["overrides"],
            namespace=spec["namespace"],
        )
    except DockyardConfigError as exc:
        raise BadRequest(str(exc), code="invalid_dockyard") from None
    except RecursionError:
        raise BadRequest(
            "the dockyard launch is nested too deep to render: flatten the recipe or infra",
            code="invalid_dockyard",
        ) from None


# --- synchronous helpers (run on the database thread) -----------------------------------------


def _provider(conn: sqlite3.Connection, ns: str, name: str) -> Provider:
    row = conn.execute("SELECT body FROM providers WHERE namespace = ? AND name = ?", (ns, name)).fetchone()
    if row is None:
        raise NotFound(
            f"no provider {name!r} in namespace {ns!r}: create it with 'nymph providers add'",
            code="provider_not_found",
        )
    body = json.loads(row[0])
    return Provider(
        name=body["name"], kwargs=body["kwargs"], launcher=body["launcher"], dispatch=body["dispatch"]
    )


def _mode(conn: sqlite3.Connection, ns: str, name: str) -> Mode:
    row = conn.execute("SELECT body FROM modes WHERE namespace = ? AND name = ?", (ns, name)).fetchone()
    if row is None:
        raise NotFound(
            f"no mode {name!r} in namespace {ns!r}: create it with 'nymph modes add'",
            code="mode_not_found",
        )
    body = json.loads(row[0])
    return Mode(name=body["name"], provider=body["provider"], fields=body["fields"])


def _mode_for(conn: sqlite3.Connection, ns: str, provider: Provider, mode_name: str) -> Mode:
    mode = _mode(conn, ns, mode_name)
    if mode.provider not in (None, provider.name):
        raise BadRequest(
            f"mode {mode.name!r} belongs to provider {mode.provider!r}, not {provider.name!r}: "
            "launch it on that provider or pick another mode",
            code="mode_provider_mismatch",
        )
    return mode


def _build(*, provider: Provider, mode: Mode, body: Mapping[str, Any], ns: str) -> LaunchSpec:
    try:
        return build_launch_spec(
            provider=provider, mode=mode, body=body, instance_id=new_instance_id(), owner_namespace=ns
        )
    except (ValidationError, ConfigError) as exc:
        raise BadRequest(str(exc), code="invalid_launch") from None


def _kube_namespace(provider: Provider) -> str:
    try:
        return check_namespace(provider.namespace, field="provider.namespace")
    except ValidationError as exc:
        raise BadRequest(str(exc), code="invalid_provider") from None


def _instance_row(conn: sqlite3.Connection, ns: str, provider: str, instance_id: str) -> sqlite3.Row:
    row = fetch_instance(conn, instance_id)
    if row is None or row["namespace"] != ns or row["provider"] != provider:
        raise NotFound(
            f"no instance {instance_id!r} of provider {provider!r} in namespace {ns!r}: "
            "list them with 'nymph instances PROVIDER'",
            code="instance_not_found",
        )
    return row


def _insert_task(
    conn: sqlite3.Connection,
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
) -> str:
    task_id = new_task_id()
    conn.execute(
        "INSERT INTO tasks (task_id, kind, status, namespace, kube_namespace, provider, "
        "instance_id, spec, requester, after_task, grace_period, created_at, updated_at) "
        "VALUES (?, ?, 'pending', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            task_id,
            kind,
            ns,
            kube_ns,
            provider,
            instance_id,
            json.dumps(spec) if spec is not None else None,
            requester,
            after,
            grace,
            ts,
            ts,
        ),
    )
    return task_id


def _launch(
    conn: sqlite3.Connection,
    *,
    ns: str,
    provider_name: str,
    body: Mapping[str, Any],
    idempotency_key: str | None,
    requester: str,
) -> tuple[LaunchAccepted, bool]:
    digest = body_digest(body)
    replay = _replay(conn, ns=ns, provider=provider_name, key=idempotency_key, digest=digest)
    if replay is not None:
        return replay, False
    provider = _provider(conn, ns, provider_name)
    mode = _mode_for(conn, ns, provider, str(body["mode"]))
    spec = _build(provider=provider, mode=mode, body={k: v for k, v in body.items() if k != "mode"}, ns=ns)
    ts = now()
    accepted = _new_instance(
        conn,
        instance_id=spec.instance_id,
        ns=ns,
        provider=provider.name,
        kube_ns=spec.namespace,
        requester=requester,
        ts=ts,
    )
    _insert_task(
        conn,
        kind=TaskKind.LAUNCH.value,
        ns=ns,
        kube_ns=spec.namespace,
        provider=provider.name,
        instance_id=spec.instance_id,
        spec=spec.to_json(),
        requester=requester,
        ts=ts,
    )
    _remember(
        conn, ns=ns, provider=provider_name, key=idempotency_key, digest=digest, accepted=accepted, ts=ts
    )
    return accepted, True


def _dockyard(
    conn: sqlite3.Connection,
    *,
    ns: str,
    provider_name: str,
    body: Mapping[str, Any],
    kube_ns: str,
    idempotency_key: str | None,
    requester: str,
) -> tuple[LaunchAccepted, bool]:
    """Queue a dockyard launch whose spec :func:`check_dockyard` accepted for ``kube_ns``."""
    digest = body_digest({"dockyard": body})
    replay = _replay(conn, ns=ns, provider=provider_name, key=idempotency_key, digest=digest)
    if replay is not None:
        return replay, False
    provider = _provider(conn, ns, provider_name)
    if _kube_namespace(provider) != kube_ns:
        raise Conflict(
            f"provider {provider_name!r} changed its kube namespace while this launch was being "
            "checked: send it again",
            code="provider_changed",
        )
    instance_id = new_instance_id()
    ts = now()
    accepted = _new_instance(
        conn,
        instance_id=instance_id,
        ns=ns,
        provider=provider.name,
        kube_ns=kube_ns,
        requester=requester,
        ts=ts,
    )
    _insert_task(
        conn,
        kind=TaskKind.DOCKYARD.value,
        ns=ns,
        kube_ns=kube_ns,
        provider=provider.name,
        instance_id=instance_id,
        spec={**body, "namespace": kube_ns},
        requester=requester,
        ts=ts,
    )
    _remember(
        conn, ns=ns, provider=provider_name, key=idempotency_key, digest=digest, accepted=accepted, ts=ts
    )
    return accepted, True


def _replay(
    conn: sqlite3.Connection, *, ns: str, provider: str, key: str | None, digest: str
) -> LaunchAccepted | None:
    """The 202 body a launch sent earlier with this Idempotency-Key, if any (same body only)."""
    if key is None:
        return None
    row = conn.execute(
        "SELECT body_sha256, response FROM idempotency_keys WHERE namespace = ? AND provider = ? AND key = ?",
        (ns, provider, key),
    ).fetchone()
    if row is None:
        return None
    if row["body_sha256"] != digest:
        raise Conflict(
            "this Idempotency-Key was already used for a different launch body: use a "
            "new key for a new launch",
            code="idempotency_key_reused",
        )
    replay: LaunchAccepted = json.loads(row["response"])
    return replay


def _remember(
    conn: sqlite3.Connection,
    *,
    ns: str,
    provider: str,
    key: str | None,
    digest: str,
    accepted: LaunchAccepted,
    ts: float,
) -> None:
    if key is not None:
        conn.execute(
            "INSERT INTO idempotency_keys (namespace, provider, key, body_sha256, instance_id, "
            "response, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (ns, provider, key, digest, accepted["instanceId"], json.dumps(accepted), ts),
        )


def _new_instance(
    conn: sqlite3.Connection,
    *,
    instance_id: str,
    ns: str,
    provider: str,
    kube_ns: str,
    requester: str,
    ts: float,
) -> LaunchAccepted:
    conn.execute(
        "INSERT INTO instances (instance_id, namespace, provider, kube_namespace, state, reason, "
        "message, node, launched_at, updated_at, version, requester) "
        "VALUES (?, ?, ?, ?, ?, NULL, '', NULL, ?, ?, 1, ?)",
        (instance_id, ns, provider, kube_ns, InstanceState.QUEUED.value, ts, ts, requester),
    )
    conn.execute(
        "INSERT INTO instance_events (instance_id, state, reason, message, at) VALUES (?, ?, NULL, '', ?)",
        (instance_id, InstanceState.QUEUED.value, ts),
    )
    return LaunchAccepted(
        instanceId=instance_id,
        state=InstanceState.QUEUED.value,
        providerName=provider,
        launchedAt=iso(ts),
    )


def _stop(
    conn: sqlite3.Connection,
    *,
    ns: str,
    provider: str,
    instance_id: str,
    grace: int | None,
    requester: str,
) -> tuple[bool, bool]:
    """Returns (instance changed, task queued)."""
    row = _instance_row(conn, ns, provider, instance_id)
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
    if launch is not None and launch["status"] == "pending":
        conn.execute(
            "UPDATE tasks SET status = 'cancelled', finished_at = ?, updated_at = ?, "
            "error = 'stopped before it was applied' WHERE task_id = ?",
            (ts, ts, launch["task_id"]),
        )
        if launch["attempts"] == 0:
            transition(
                conn,
                instance_id=instance_id,
                now=ts,
                state=InstanceState.STOPPED.value,
                reason=Reason.STOPPED.value,
                message="stopped before a daemon picked up the launch",
            )
            return True, False
    after = launch["task_id"] if launch is not None and launch["status"] == "leased" else None
    # A dockyard instance has no Pod named after it: its stop task carries the dockyard spec, so
    # the daemon renders the same objects again and deletes them.
    stop_spec = None
    if launch is not None and launch["kind"] == TaskKind.DOCKYARD.value:
        stop_spec = {"dockyard": json.loads(launch["spec"])}
    _insert_task(
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


def _probe(
    conn: sqlite3.Connection, *, ns: str, provider_name: str, mode_name: str | None, requester: str
) -> str:
    provider = _provider(conn, ns, provider_name)
    if mode_name is not None:
        mode = _mode_for(conn, ns, provider, mode_name)
    else:
        mode = Mode(name="probe", provider=provider.name, fields={"image": PROBE_IMAGE})
    spec = _build(
        provider=provider,
        mode=mode,
        body={"script": PROBE_SCRIPT, "tags": {"nymph-probe": "true"}},
        ns=ns,
    )
    return _insert_task(
        conn,
        kind="probe",
        ns=ns,
        kube_ns=spec.namespace,
        provider=provider.name,
        instance_id=spec.instance_id,
        spec=spec.to_json(),
        requester=requester,
        ts=now(),
    )


# --- the async store ---------------------------------------------------------------------------


class Store:
    def __init__(self, *, db: Database, settings: QueueSettings) -> None:
        self.db = db
        self.settings = settings
        #: Woken whenever a task may have become claimable.
        self.tasks_changed = Signal()
        #: Woken per instance id whenever an instance changed.
        self.instance_changed = KeyedSignal()

    def close_waiters(self) -> None:
        """Release every held long-poll (shutdown)."""
        self.tasks_changed.close()
        self.instance_changed.close()

    # providers and modes

    async def put_provider(self, *, ns: str, provider: Provider, replace: bool) -> dict[str, Any]:
        body = provider.to_json()

        def run(conn: sqlite3.Connection) -> None:
            ts = now()
            exists = conn.execute(
                "SELECT 1 FROM providers WHERE namespace = ? AND name = ?", (ns, provider.name)
            ).fetchone()
            if exists and not replace:
                raise Conflict(
                    f"provider {provider.name!r} already exists in namespace {ns!r}: delete it "
                    "first or PUT to replace it",
                    code="provider_exists",
                )
            conn.execute(
                "INSERT INTO providers (namespace, name, body, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (namespace, name) DO UPDATE SET "
                "body = excluded.body, updated_at = excluded.updated_at",
                (ns, provider.name, json.dumps(body), ts, ts),
            )

        await self.db.write(run)
        return body

    async def list_providers(self, *, ns: str) -> list[dict[str, Any]]:
        rows = await self.db.read(
            lambda conn: conn.execute(
                "SELECT body FROM providers WHERE namespace = ? ORDER BY name", (ns,)
            ).fetchall()
        )
        return [json.loads(r[0]) for r in rows]

    async def get_provider(self, *, ns: str, name: str) -> dict[str, Any]:
        provider = await self.db.read(lambda conn: _provider(conn, ns, name))
        return provider.to_json()

    async def delete_provider(self, *, ns: str, name: str) -> None:
        def run(conn: sqlite3.Connection) -> None:
            cur = conn.execute("DELETE FROM providers WHERE namespace = ? AND name = ?", (ns, name))
            if not cur.rowcount:
                _provider(conn, ns, name)

        await self.db.write(run)

    async def put_mode(self, *, ns: str, mode: Mode, replace: bool) -> dict[str, Any]:
        body = mode.to_json()

        def run(conn: sqlite3.Connection) -> None:
            if mode.provider is not None:
                row = conn.execute(
                    "SELECT 1 FROM providers WHERE namespace = ? AND name = ?", (ns, mode.provider)
                ).fetchone()
                if row is None:
                    raise BadRequest(
                        f"mode {mode.name!r} names provider {mode.provider!r}, which does not "
                        f"exist in namespace {ns!r}: create the provider first",
                        code="unknown_provider",
                    )
            exists = conn.execute(
                "SELECT 1 FROM modes WHERE namespace = ? AND name = ?", (ns, mode.name)
            ).fetchone()
            if exists and not replace:
                raise Conflict(
                    f"mode {mode.name!r} already exists in namespace {ns!r}: delete it first or "
                    "PUT to replace it",
                    code="mode_exists",
                )
            ts = now()
            conn.execute(
                "INSERT INTO modes (namespace, name, provider, body, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (namespace, name) DO UPDATE SET "
                "provider = excluded.provider, body = excluded.body, updated_at = excluded.updated_at",
                (ns, mode.name, mode.provider, json.dumps(body), ts, ts),
            )

        await self.db.write(run)
        return body

    async def list_modes(self, *, ns: str) -> list[dict[str, Any]]:
        rows = await self.db.read(
            lambda conn: conn.execute(
                "SELECT body FROM modes WHERE namespace = ? ORDER BY name", (ns,)
            ).fetchall()
        )
        return [json.loads(r[0]) for r in rows]

    async def get_mode(self, *, ns: str, name: str) -> dict[str, Any]:
        mode = await self.db.read(lambda conn: _mode(conn, ns, name))
        return mode.to_json()

    async def delete_mode(self, *, ns: str, name: str) -> None:
        def run(conn: sqlite3.Connection) -> None:
            cur = conn.execute("DELETE FROM modes WHERE namespace = ? AND name = ?", (ns, name))
            if not cur.rowcount:
                _mode(conn, ns, name)

        await self.db.write(run)

    # launches and instances

    async def launch(
        self,
        *,
        ns: str,
        provider: str,
        body: Mapping[str, Any],
        idempotency_key: str | None,
        principal: Principal,
    ) -> LaunchAccepted:
        accepted, created = await self.db.write(
            lambda conn: _launch(
                conn,
                ns=ns,
                provider_name=provider,
                body=body,
                idempotency_key=idempotency_key,
                requester=principal.requester,
            )
        )
        if created:
            self.tasks_changed.notify()
            log.info(
                "launch accepted",
                instance=accepted["instanceId"],
                namespace=ns,
                provider=provider,
                requester=principal.requester,
            )
        return accepted

    async def launch_dockyard(
        self,
        *,
        ns: str,
        provider: str,
        recipe: Mapping[str, Any],
        infra: Mapping[str, Any],
        overrides: Sequence[str],
        idempotency_key: str | None,
        principal: Principal,
    ) -> LaunchAccepted:
        """Check the dockyard launch in full for the provider's kube namespace (rendered off the
        database thread), then queue its instance and task in one transaction."""
        kube_ns = _kube_namespace(await self.db.read(lambda conn: _provider(conn, ns, provider)))
        body = {"recipe": dict(recipe), "infra": dict(infra), "overrides": list(overrides)}
        await asyncio.to_thread(check_dockyard, {**body, "namespace": kube_ns})
        accepted, created = await self.db.write(
            lambda conn: _dockyard(
                conn,
                ns=ns,
                provider_name=provider,
                body=body,
                kube_ns=kube_ns,
                idempotency_key=idempotency_key,
                requester=principal.requester,
            )
        )
        if created:
            self.tasks_changed.notify()
            log.info(
                "dockyard launch accepted",
                instance=accepted["instanceId"],
                namespace=ns,
                provider=provider,
                kube_namespace=kube_ns,
                requester=principal.requester,
            )
        return accepted

    async def list_instances(self, *, ns: str, provider: str, state: str | None) -> list[InstanceJSON]:
        def run(conn: sqlite3.Connection) -> list[InstanceJSON]:
            sql = f"SELECT {INSTANCE_COLUMNS} FROM instances WHERE namespace = ? AND provider = ?"  # noqa: S608
            params: list[Any] = [ns, provider]
            if state is not None:
                sql += " AND state = ?"
                params.append(state)
            rows = conn.execute(sql + " ORDER BY launched_at, instance_id", params).fetchall()
            return instances_json(conn, rows)

        return await self.db.read(run)

    async def get_instance(self, *, ns: str, provider: str, instance_id: str) -> InstanceJSON:
        def run(conn: sqlite3.Connection) -> InstanceJSON:
            return instances_json(conn, [_instance_row(conn, ns, provider, instance_id)])[0]

        return await self.db.read(run)

    async def stop_instance(
        self, *, ns: str, provider: str, instance_id: str, grace: int | None, principal: Principal
    ) -> None:
        changed, queued = await self.db.write(
            lambda conn: _stop(
                conn,
                ns=ns,
                provider=provider,
                instance_id=instance_id,
                grace=grace,
                requester=principal.requester,
            )
        )
        if changed:
            self.instance_changed.notify(instance_id)
            log.info("stop requested", instance=instance_id, task=queued, requester=principal.requester)
        if queued:
            self.tasks_changed.notify()

    async def get_logs(self, *, ns: str, provider: str, instance_id: str) -> str | None:
        def run(conn: sqlite3.Connection) -> str | None:
            _instance_row(conn, ns, provider, instance_id)
            row = conn.execute(
                "SELECT text FROM instance_logs WHERE instance_id = ?", (instance_id,)
            ).fetchone()
            return None if row is None else str(row[0])

        return await self.db.read(run)

    async def probe(self, *, ns: str, provider: str, mode: str | None, principal: Principal) -> str:
        task_id = await self.db.write(
            lambda conn: _probe(
                conn, ns=ns, provider_name=provider, mode_name=mode, requester=principal.requester
            )
        )
        self.tasks_changed.notify()
        return task_id

    async def get_task(self, *, ns: str, task_id: str) -> TaskStatusJSON:
        def run(conn: sqlite3.Connection) -> TaskStatusJSON:
            row = conn.execute(
                "SELECT * FROM tasks WHERE task_id = ? AND namespace = ?", (task_id, ns)
            ).fetchone()
            if row is None:
                raise NotFound(f"no task {task_id!r} in namespace {ns!r}", code="task_not_found")
            return task_status_json(row)

        return await self.db.read(run)

    async def list_daemons(self) -> list[DaemonJSON]:
        rows = await self.db.read(
            lambda conn: conn.execute("SELECT * FROM daemons ORDER BY node, daemon_id").fetchall()
        )
        return [
            DaemonJSON(
                daemonId=r["daemon_id"],
                node=r["node"],
                namespaces=json.loads(r["namespaces"]),
                lastSeen=iso(r["last_seen"]),
                capacity=r["capacity"],
            )
            for r in rows
        ]

    # dispatch

    async def claim(self, *, req: ClaimRequest, scope: str | None) -> ClaimResult:
        lease = self.settings.lease
        return await self.db.write(
            lambda conn: leases.claim(conn, req=req, scope=scope, now=now(), lease=lease)
        )

    async def renew(
        self, *, daemon_id: str, task_ids: Sequence[str], lease_seconds: int
    ) -> tuple[list[str], list[str]]:
        return await self.db.write(
            lambda conn: leases.renew(
                conn, daemon_id=daemon_id, task_ids=task_ids, lease_seconds=lease_seconds, now=now()
            )
        )

    async def release(self, *, daemon_id: str, task_ids: Sequence[str]) -> list[str]:
        released = await self.db.write(
            lambda conn: leases.release(conn, daemon_id=daemon_id, task_ids=task_ids, now=now())
        )
        if released:
            self.tasks_changed.notify()
        return released

    async def complete(
        self,
        *,
        daemon_id: str,
        task_id: str,
        ok: bool,
        error: str | None,
        retryable: bool,
        result: dict[str, Any] | None,
        scope: str | None,
    ) -> dict[str, Any]:
        retry = self.settings.retry
        body, changed = await self.db.write(
            lambda conn: leases.complete(
                conn,
                daemon_id=daemon_id,
                task_id=task_id,
                ok=ok,
                error=error,
                retryable=retryable,
                result=result,
                scope=scope,
                now=now(),
                retry=retry,
            )
        )
        self.tasks_changed.notify()
        if changed is not None:
            self.instance_changed.notify(changed)
        log.info("task completed", task=task_id, daemon=daemon_id, status=body["status"])
        return body

    async def report(self, *, stream: str, reports: Sequence[Report], scope: str | None) -> tuple[int, int]:
        accepted, last, changed = await self.db.write(
            lambda conn: leases.report(conn, stream=stream, reports=reports, scope=scope, now=now())
        )
        for instance_id in changed:
            self.instance_changed.notify(instance_id)
        return accepted, last

    async def upload_logs(self, *, instance_id: str, logs: str, scope: str | None) -> None:
        max_bytes = self.settings.limits.max_log_bytes
        await self.db.write(
            lambda conn: leases.store_logs(
                conn, instance_id=instance_id, logs=logs, scope=scope, max_bytes=max_bytes, now=now()
            )
        )

    async def active(self, *, node: str, scope: str | None) -> list[ActiveJSON]:
        return await self.db.read(lambda conn: leases.active(conn, node=node, scope=scope))

    async def sweep(self) -> int:
        count = await self.db.write(lambda conn: leases.sweep(conn, now=now()))
        if count:
            self.tasks_changed.notify()
            log.info("expired leases handed back", tasks=count)
        return count
