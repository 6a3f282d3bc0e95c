"""Launch groups through the database: accept, read, list the members of, stop (the HTTP side is
:mod:`nymph.queue.http.routes.groups`; the SQL :mod:`nymph.queue.sql.groups`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import structlog

from nymph.protocol import InstanceJSON, now
from nymph.queue.db import Backend
from nymph.queue.models import Principal
from nymph.queue.notify import KeyedSignal, WorkSignal
from nymph.queue.paging import Page, PageRequest, page_of
from nymph.queue.sql import groups
from nymph.queue.sql.dialect import Conn
from nymph.queue.sql.launches import Guard
from nymph.queue.sql.rows import instances_json

log = structlog.get_logger(__name__, component="queue.groups")


class GroupBook:
    def __init__(
        self,
        *,
        db: Backend,
        guard: Callable[[Principal], Guard],
        image_pull_timeout: int | None,
        tasks_changed: WorkSignal,
        instance_changed: KeyedSignal,
    ) -> None:
        self._db = db
        self._guard = guard
        self._image_pull_timeout = image_pull_timeout
        self._tasks_changed = tasks_changed
        self._instance_changed = instance_changed

    async def launch(
        self,
        *,
        ns: str,
        provider: str,
        body: Mapping[str, Any],
        idempotency_key: str | None,
        principal: Principal,
    ) -> dict[str, Any]:
        """Accept a whole group (or replay its Idempotency-Key): the 202 body."""
        guard = self._guard(principal)
        got = await self._db.write(
            lambda conn: groups.accept_group(
                conn,
                ns=ns,
                provider_name=provider,
                body=body,
                idempotency_key=idempotency_key,
                requester=principal.requester,
                ts=now(),
                guard=guard,
                image_pull_timeout=self._image_pull_timeout,
            )
        )
        if got.tasks:
            self._tasks_changed.notify(got.tasks)
        if got.created:
            log.info(
                "launch group accepted",
                group=got.accepted["groupId"],
                launches=got.accepted["total"],
                namespace=ns,
                provider=provider,
                requester=principal.requester,
            )
        return got.accepted

    async def get(self, *, ns: str, group_id: str) -> dict[str, Any]:
        return await self._db.read(lambda conn: groups.group_json(conn, ns=ns, group_id=group_id))

    async def instances(self, *, ns: str, group_id: str, page: PageRequest) -> Page[InstanceJSON]:
        def read(conn: Conn) -> Page[InstanceJSON]:
            groups.group_row(conn, ns=ns, group_id=group_id)
            sql, params = groups.group_page_query(group_id=group_id, after=page.after, limit=page.limit)
            rows = page_of(
                conn.execute(sql, params).fetchall(),
                limit=page.limit,
                key_of=lambda r: (int(r["group_index"]), int(r["attempt"])),
            )
            return Page(items=instances_json(conn, rows.items), next_key=rows.next_key)

        return await self._db.read(read)

    async def stop(self, *, ns: str, group_id: str, principal: Principal) -> groups.GroupStop:
        """Stop what the database can stop; the caller deletes the direct Pods it names."""
        done = await self._db.write(
            lambda conn: groups.stop_group(
                conn, ns=ns, group_id=group_id, requester=principal.requester, now=now()
            )
        )
        for iid in done.changed:
            self._instance_changed.notify(iid)
        if done.tasks:
            self._tasks_changed.notify(done.tasks)
        log.info(
            "launch group stop",
            group=group_id,
            changed=len(done.changed),
            stop_tasks=done.tasks,
            direct=len(done.direct),
            requester=principal.requester,
        )
        return done
