"""The queue's state in its database (SQLite, or PostgreSQL for replicas), behind async methods
(the thin facade over :mod:`nymph.queue.sql`).

Each method is one transaction on the database thread (see :mod:`nymph.queue.db`); after a
commit that can make a task claimable or change an instance, the matching long-polls are woken
(:mod:`nymph.queue.notify`). A dockyard launch is rendered by its route before the store is
called; nothing here renders one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import structlog

from nymph.launch.config import Mode, Provider
from nymph.launch.spec import LaunchSpec
from nymph.protocol import (
    ActiveJSON,
    CompleteAnswer,
    InstanceJSON,
    LaunchAccepted,
    TaskStatusJSON,
    now,
)
from nymph.queue import tenancy
from nymph.queue.broadcast import EVENTS_KEY, wake_for, work_key
from nymph.queue.db import SWEEP_LOCK, Backend
from nymph.queue.direct.records import DirectRecords
from nymph.queue.duewrites import DueWrites
from nymph.queue.errors import ServiceError
from nymph.queue.events import EventFeed
from nymph.queue.expiry import InstanceExpiry
from nymph.queue.groups import GroupBook
from nymph.queue.launchbatch import Accepted, BatchKey, LaunchBatcher
from nymph.queue.lists import PagedLists
from nymph.queue.models import (
    ClaimRequest,
    ClaimResult,
    DaemonSession,
    Principal,
    QueueSettings,
    Report,
    TaskCompletion,
)
from nymph.queue.notify import KeyedSignal, WorkSignal
from nymph.queue.output import OutputStore
from nymph.queue.quotabook import QuotaBook
from nymph.queue.sql import catalog, completions, dispatch, instances, launches, leases
from nymph.queue.sql import reports as sql_reports
from nymph.queue.sql.dialect import Conn
from nymph.queue.wakeup import LaunchWork

log = structlog.get_logger(__name__, component="queue.store")


class Store:
    def __init__(self, *, db: Backend, settings: QueueSettings) -> None:
        self.db = db
        self.settings = settings
        #: Woken, one waiting claim per new task, whenever a task may have become claimable
        #: (here and, told through the database, on every other replica).
        self.tasks_changed = WorkSignal(
            relay=(lambda count, item: db.broadcast(work_key(count, item))) if db.relays else None
        )
        #: Woken per instance id whenever an instance changed.
        self.instance_changed = KeyedSignal(relay=db.broadcast)
        #: The namespaces' event streams (woken after each commit that added events).
        self.events = EventFeed(db=db, relay=lambda ns: db.broadcast(EVENTS_KEY + ns))
        db.events_written = self.events.written
        #: Logs and result files.
        self.output = OutputStore(db=db, settings=settings.output)
        #: The direct path's instances and Pod records.
        self.direct = DirectRecords(db=db)
        #: Paged lists (instances, secrets, providers, modes, daemons).
        self.lists = PagedLists(db=db)
        #: Namespaces' scheduling settings (weights, quotas, runtime limits) and usage.
        self.quotas = QuotaBook(db=db)
        #: The expiry of stopped instances (run by the sweeper).
        self.expiry = InstanceExpiry(db=db, settings=settings.output)
        #: Held by this replica's sweep: one asked for meanwhile waits for it, then runs.
        self._sweeping = asyncio.Lock()
        #: Daemons whose idle claims found their records due a refresh: id -> when (written in
        #: one batch by :meth:`flush_seen`, instead of a write transaction per claim).
        self._seen_due = DueWrites(lambda conn, due: dispatch.refresh_seen(conn, due))
        #: Launches without an Idempotency-Key that arrive together, written together
        #: (PostgreSQL: see :attr:`~nymph.queue.db.Backend.batches_launches`).
        self._launch_batches = LaunchBatcher(write=self._write_launch_batch, alone=self._write_launch_alone)
        #: Launch groups.
        self.groups = GroupBook(
            db=db,
            guard=self.guard,
            image_pull_timeout=settings.launch.image_pull_timeout,
            tasks_changed=self.tasks_changed,
            instance_changed=self.instance_changed,
        )

    def woken_elsewhere(self, key: str) -> None:
        """Another replica changed something: wake the long-polls it concerns here."""
        wake_for(
            key,
            tasks=self.tasks_changed,
            instances=self.instance_changed,
            events=self.events.added,
            appended=self.output.appended,
        )

    def close_waiters(self) -> None:
        """Release every held long-poll (shutdown)."""
        self.tasks_changed.close()
        self.instance_changed.close()
        self.events.added.close()
        self.output.close_waiters()

    def count_launch_batches(self, written: Callable[[int], None]) -> None:
        """Tell ``written`` the launches of each launch batch written (the metrics)."""
        self._launch_batches.written = written

    async def drain_launches(self) -> None:
        """Wait for the launch batches under way (a stopping queue)."""
        await self._launch_batches.drain()

    def _changed(self, instance_ids: Iterable[str]) -> None:
        for instance_id in instance_ids:
            self.instance_changed.notify(instance_id)

    # providers and modes

    async def put_provider(self, *, ns: str, provider: Provider, replace: bool) -> dict[str, Any]:
        return await self.db.write(
            lambda conn: catalog.put_provider(conn, ns=ns, provider=provider, replace=replace)
        )

    async def list_providers(self, *, ns: str) -> list[dict[str, Any]]:
        return await self.db.read(lambda conn: catalog.list_providers(conn, ns=ns))

    async def get_provider(self, *, ns: str, name: str) -> dict[str, Any]:
        provider = await self.db.read(lambda conn: catalog.get_provider(conn, ns=ns, name=name))
        return provider.to_json()

    def guard(self, principal: Principal) -> launches.Guard:
        """The tenancy check of every launch ``principal`` sends (run on the spec it would run)."""
        settings = self.settings.tenancy

        def check(spec: LaunchSpec) -> None:
            tenancy.check_spec(settings, principal=principal, spec=spec)

        return check

    async def get_provider_config(self, *, ns: str, name: str) -> Provider:
        """The provider as configured (NotFound when there is none)."""
        return await self.db.read_one(lambda conn: catalog.get_provider(conn, ns=ns, name=name))

    async def provider_kube_namespace(self, *, ns: str, name: str) -> str:
        """The kube namespace a provider launches into (checked), or NotFound / BadRequest."""
        provider = await self.db.read(lambda conn: catalog.get_provider(conn, ns=ns, name=name))
        return catalog.kube_namespace(provider)

    async def delete_provider(self, *, ns: str, name: str) -> None:
        await self.db.write(lambda conn: catalog.delete_provider(conn, ns=ns, name=name))

    async def put_mode(self, *, ns: str, mode: Mode, replace: bool) -> dict[str, Any]:
        return await self.db.write(lambda conn: catalog.put_mode(conn, ns=ns, mode=mode, replace=replace))

    async def list_modes(self, *, ns: str) -> list[dict[str, Any]]:
        return await self.db.read(lambda conn: catalog.list_modes(conn, ns=ns))

    async def get_mode(self, *, ns: str, name: str) -> dict[str, Any]:
        mode = await self.db.read(lambda conn: catalog.get_mode(conn, ns=ns, name=name))
        return mode.to_json()

    async def delete_mode(self, *, ns: str, name: str) -> None:
        await self.db.write(lambda conn: catalog.delete_mode(conn, ns=ns, name=name))

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
        spec: dict[str, Any] | None
        told = idempotency_key is None and self.db.batches_launches
        if told:
            # with the launches that come in the same turn (one write for them all, which tells
            # the other replicas itself)
            accepted, spec = await self._launch_batches.launch(
                BatchKey(ns=ns, provider=provider, mode=str(body["mode"])),
                launches.BatchLaunch(body=body, requester=principal.requester, guard=self.guard(principal)),
            )
        else:
            one = launches.BatchLaunch(body=body, requester=principal.requester, guard=self.guard(principal))
            accepted, spec = await self.db.write(
                lambda conn: self._launch_one(conn, ns, provider, one, idempotency_key=idempotency_key)
            )
        if spec is not None:
            work = _work(spec)
            if told:
                self.tasks_changed.wake(1, item=work)
            else:
                self.tasks_changed.notify(1, item=work)
            log.info(
                "launch accepted",
                instance=accepted["instanceId"],
                namespace=ns,
                provider=provider,
                requester=principal.requester,
            )
        return accepted

    # A batch's launches (and a launch of a batch sent again alone) tell the other replicas of
    # their tasks inside their write, with its commit (Backend.broadcast_with); the store then
    # wakes this replica's claims only (see launch).

    async def _write_launch_batch(
        self, key: BatchKey, items: Sequence[launches.BatchLaunch]
    ) -> list[launches.BatchOutcome]:
        def write(conn: Conn) -> list[launches.BatchOutcome]:
            outcomes = launches.launch_batch(
                conn,
                ns=key.ns,
                provider_name=key.provider,
                mode_name=key.mode,
                items=items,
                image_pull_timeout=self.settings.launch.image_pull_timeout,
            )
            self.db.broadcast_with(
                conn, [_work_key(o[1]) for o in outcomes if not isinstance(o, ServiceError)]
            )
            return outcomes

        return await self.db.write(write)

    async def _write_launch_alone(self, key: BatchKey, item: launches.BatchLaunch) -> Accepted:
        def write(conn: Conn) -> Accepted:
            accepted, spec = self._launch_one(conn, key.ns, key.provider, item, idempotency_key=None)
            assert spec is not None  # no Idempotency-Key: never a replay
            self.db.broadcast_with(conn, [_work_key(spec)])
            return accepted, spec

        return await self.db.write(write)

    def _launch_one(
        self, conn: Conn, ns: str, provider: str, item: launches.BatchLaunch, *, idempotency_key: str | None
    ) -> tuple[LaunchAccepted, dict[str, Any] | None]:
        """One launch in its own write (:func:`nymph.queue.sql.launches.launch`)."""
        return launches.launch(
            conn,
            ns=ns,
            provider_name=provider,
            body=item.body,
            idempotency_key=idempotency_key,
            requester=item.requester,
            guard=item.guard,
            image_pull_timeout=self.settings.launch.image_pull_timeout,
        )

    async def launch_dockyard(
        self,
        *,
        ns: str,
        provider: str,
        body: Mapping[str, Any],
        kube_ns: str,
        idempotency_key: str | None,
        principal: Principal,
        max_runtime: int | None = None,
    ) -> LaunchAccepted:
        """Queue a dockyard launch (``{"recipe", "infra", "overrides"}``) that the caller has
        already rendered in full for the provider's kube namespace ``kube_ns`` (with the
        namespace's runtime limit ``max_runtime``, seconds)."""
        accepted, created = await self.db.write(
            lambda conn: launches.launch_dockyard(
                conn,
                ns=ns,
                provider_name=provider,
                body=body,
                kube_ns=kube_ns,
                idempotency_key=idempotency_key,
                requester=principal.requester,
                max_runtime=max_runtime,
            )
        )
        if created:
            self.tasks_changed.notify(1)
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
        return await self.db.read(
            lambda conn: instances.list_instances(conn, ns=ns, provider=provider, state=state)
        )

    async def get_instance(self, *, ns: str, provider: str, instance_id: str) -> InstanceJSON:
        return await self.db.read(
            lambda conn: instances.get_instance(conn, ns=ns, provider=provider, instance_id=instance_id)
        )

    async def stop_instance(
        self, *, ns: str, provider: str, instance_id: str, grace: int | None, principal: Principal
    ) -> None:
        changed, queued = await self.db.write(
            lambda conn: instances.stop(
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
            self.tasks_changed.notify(1)

    async def probe(self, *, ns: str, provider: str, mode: str | None, principal: Principal) -> str:
        task_id = await self.db.write(
            lambda conn: launches.probe(
                conn,
                ns=ns,
                provider_name=provider,
                mode_name=mode,
                requester=principal.requester,
                guard=self.guard(principal),
            )
        )
        self.tasks_changed.notify(1)
        return task_id

    async def get_task(self, *, ns: str, task_id: str) -> TaskStatusJSON:
        return await self.db.read(lambda conn: instances.get_task(conn, ns=ns, task_id=task_id))

    # dispatch

    async def claim(self, *, req: ClaimRequest, scope: str | None) -> ClaimResult:
        lease = self.settings.lease
        # Most claims find nothing (a daemon re-polling, a wake-up meant for another): answer
        # those from a read transaction; only a claim with work (or a stale record) writes.
        idle = await self.db.read_small(
            lambda conn: dispatch.idle_claim(conn, req=req, scope=scope, now=now(), lease=lease)
        )
        if idle is not None:
            if idle.seen_due:
                self._seen_due.put(req.daemon_id, now())
            return idle
        result = await self.db.write(
            lambda conn: dispatch.claim(conn, req=req, scope=scope, now=now(), lease=lease)
        )
        self._changed(result.settled)
        return result

    async def flush_seen(self) -> int:
        """Write the ``last_seen`` refreshes idle claims left due, in one transaction; how many.
        Run every few seconds on every replica (a refresh is due 60 s after the last one and a
        daemon stays live for 150 s, so a batch lost with a replica costs no daemon its place)."""
        return await self._seen_due.flush(self.db)

    async def renew(
        self, *, session: DaemonSession, task_ids: Sequence[str], lease_seconds: int
    ) -> tuple[list[str], list[str]]:
        return await self.db.write(
            lambda conn: leases.renew(
                conn, session=session, task_ids=task_ids, lease_seconds=lease_seconds, now=now()
            )
        )

    async def release(self, *, session: DaemonSession, task_ids: Sequence[str]) -> list[str]:
        released = await self.db.write(
            lambda conn: leases.release(conn, session=session, task_ids=task_ids, now=now())
        )
        if released:
            self.tasks_changed.notify(len(released))
        return released

    async def release_all(self, *, session: DaemonSession) -> list[str]:
        """Hand back every lease the session's daemon holds (its session was replaced, or it stops)."""
        released = await self.db.write(lambda conn: leases.release_all(conn, session=session, now=now()))
        if released:
            self.tasks_changed.notify(len(released))
        return released

    async def complete(self, *, session: DaemonSession, item: TaskCompletion) -> CompleteAnswer:
        [outcome] = await self.complete_many(session=session, items=[item])
        if isinstance(outcome, ServiceError):
            raise outcome
        return outcome

    async def complete_many(
        self, *, session: DaemonSession, items: Sequence[TaskCompletion]
    ) -> list[CompleteAnswer | ServiceError]:
        """Finish each of ``items`` as :meth:`complete` would, in one transaction; per item its
        answer or its refusal (see :mod:`nymph.queue.sql.completions`)."""
        retry = self.settings.retry
        outcomes, changed = await self.db.write(
            lambda conn: completions.complete_many(conn, session=session, items=items, now=now(), retry=retry)
        )
        finished = [
            (i.task_id, o["status"]) for i, o in zip(items, outcomes, strict=True) if isinstance(o, dict)
        ]
        if finished:
            self.tasks_changed.notify(len(finished))
        self._changed(changed)
        for task_id, status in finished:
            log.info("task completed", task=task_id, daemon=session.daemon_id, status=status)
        return outcomes

    async def report(
        self, *, session: DaemonSession, stream: str, reports: Sequence[Report]
    ) -> tuple[int, int]:
        accepted, last, changed = await self.db.write(
            lambda conn: sql_reports.report(conn, session=session, stream=stream, reports=reports, now=now())
        )
        self._changed(changed)
        if changed:
            self.tasks_changed.notify(len(changed))  # an Unschedulable launch may have been moved (new tasks)
        return accepted, last

    async def upload_logs(self, *, session: DaemonSession, instance_id: str, logs: str) -> None:
        max_bytes = self.settings.limits.max_log_bytes
        await self.db.write(
            lambda conn: sql_reports.store_logs(
                conn, session=session, instance_id=instance_id, logs=logs, max_bytes=max_bytes, now=now()
            )
        )

    async def keep_log_tail(self, *, instance_id: str, logs: str) -> None:
        """The log tail of a direct launch, kept by the queue itself before it reaps the Pod."""
        max_bytes = self.settings.limits.max_log_bytes
        await self.db.write(
            lambda conn: sql_reports.keep_log_tail(
                conn, instance_id=instance_id, logs=logs, max_bytes=max_bytes, now=now()
            )
        )

    async def active(self, *, session: DaemonSession) -> list[ActiveJSON]:
        return await self.db.read(lambda conn: sql_reports.active(conn, session=session))

    async def sweep(self) -> int:
        """Settle, hand back expired leases, give waiting reasons; the count handed back. Skipped
        while another replica sweeps; after this replica's own sweep, if one is running."""
        async with self._sweeping:
            return await self._sweep()

    async def _sweep(self) -> int:
        ran, swept = await self.db.try_singleton(SWEEP_LOCK, lambda conn: dispatch.sweep(conn, now=now()))
        if not ran or swept is None:
            return 0  # another replica is sweeping right now
        count, settled = swept
        self._changed(settled)
        if count or settled:
            self.tasks_changed.notify_all()
        if count:
            log.info("expired leases handed back", tasks=count)
        await self.output.purge_due()
        await self.expiry.due()
        # events committed and not read since (their cursors come with the first read), or whose
        # replica died before it woke their followers: no follower waits longer than a sweep
        await self.db.seal_events(wake=True)
        return count


def _work(spec: Mapping[str, Any]) -> LaunchWork:
    """A launch's wake-up: it wakes only claims that may take it (their namespaces, their node's
    offer)."""
    return LaunchWork(kube_namespace=str(spec.get("namespace") or ""), spec=spec)


def _work_key(spec: Mapping[str, Any]) -> str:
    """What the other replicas are told of a launch's task."""
    return work_key(1, _work(spec))
