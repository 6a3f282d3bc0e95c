"""The queue's paged lists, behind async methods on the database thread (one read transaction
per page; the SQL is :mod:`nymph.queue.sql.pages`, the paging rules :mod:`nymph.queue.paging`)."""

from __future__ import annotations

from typing import Any

from nymph.protocol import DaemonJSON, InstanceJSON
from nymph.queue.db import Backend
from nymph.queue.models import Principal
from nymph.queue.paging import Page, PageRequest
from nymph.queue.sql import catalog, pages
from nymph.queue.sql.dialect import Row


class PagedLists:
    def __init__(self, *, db: Backend) -> None:
        self.db = db

    async def instances(
        self, *, ns: str, provider: str, state: str | None, page: PageRequest
    ) -> Page[InstanceJSON]:
        return await self.db.read(
            lambda c: pages.instances(c, ns=ns, provider=provider, state=state, page=page)
        )

    async def instance_rows(self, *, ns: str, provider: str, page: PageRequest) -> Page[Row]:
        """Raw rows (the direct path merges them with live Pods)."""
        return await self.db.read(
            lambda c: pages.instance_rows(c, ns=ns, provider=provider, state=None, page=page)
        )

    async def secrets(self, *, ns: str, page: PageRequest) -> Page[dict[str, str]]:
        return await self.db.read(lambda c: pages.secrets(c, ns=ns, page=page))

    async def providers(self, *, ns: str, page: PageRequest) -> Page[dict[str, Any]]:
        return await self.db.read(lambda c: pages.providers(c, ns=ns, page=page))

    async def modes(self, *, ns: str, page: PageRequest) -> Page[dict[str, Any]]:
        return await self.db.read(lambda c: pages.modes(c, ns=ns, page=page))

    async def namespaces(self, *, principal: Principal, limit: int = 500) -> list[str]:
        """The namespaces a principal may see: its own, or (unscoped) every one holding a
        provider or a mode."""
        if principal.namespace is not None:
            return [principal.namespace]
        return await self.db.read(lambda c: catalog.namespaces(c, limit=limit))

    async def daemons(self, *, principal: Principal, page: PageRequest) -> Page[DaemonJSON]:
        return await self.db.read(lambda c: pages.daemons(c, visible_to=principal.namespace, page=page))
