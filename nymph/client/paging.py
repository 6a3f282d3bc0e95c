"""Paged lists of the queue API: one page at a time (:class:`Page`, with the ``continue``
token of the next one), or every page followed to the end.

A list route answers ``{"items": [...], "continue": TOKEN}`` while more follow and
``{"items": [...]}`` on its last page; ``?limit=N`` (1-5000, default 500) sets the page size and
``?continue=TOKEN`` asks for the next page, with the same other query parameters. Pages follow a
stable order, so items added while a listing runs never make it repeat or skip one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from nymph.client.transport import Transport, seg
from nymph.protocol import DaemonJSON, InstanceJSON

T = TypeVar("T")

#: The page size the full-list methods ask for (the queue's maximum).
FOLLOW_LIMIT = 5_000


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a list; ``continue_`` is the token of the next page (None on the last)."""

    items: list[T]
    continue_: str | None = None


class Paging(Transport):
    """Paged reads, and the ``*_page`` methods of the user lists."""

    async def page(
        self,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        limit: int | None = None,
        continue_: str | None = None,
    ) -> Page[Any]:
        """One page of the list at ``path`` (``limit`` items at most, after ``continue_``)."""
        query = dict(params or {})
        if limit is not None:
            query["limit"] = str(limit)
        if continue_:
            query["continue"] = continue_
        body = await self.request("GET", path, params=query or None)
        token = body.get("continue")
        return Page(items=list(body["items"]), continue_=str(token) if token else None)

    async def every(self, path: str, *, params: Mapping[str, str] | None = None) -> list[Any]:
        """Every item of the list at ``path``, following ``continue`` to the last page."""
        items: list[Any] = []
        token: str | None = None
        while True:
            got = await self.page(path, params=params, limit=FOLLOW_LIMIT, continue_=token)
            items.extend(got.items)
            if got.continue_ is None or got.continue_ == token:
                return items
            token = got.continue_

    async def instances_page(
        self,
        *,
        provider: str,
        state: str | None = None,
        limit: int | None = None,
        continue_: str | None = None,
        namespace: str | None = None,
    ) -> Page[InstanceJSON]:
        """One page of a provider's instances, oldest first."""
        path = f"{self._ns(namespace)}/providers/{seg(provider)}/instances"
        params = {"state": state} if state else None
        return cast(
            Page[InstanceJSON], await self.page(path, params=params, limit=limit, continue_=continue_)
        )

    async def secrets_page(
        self, *, limit: int | None = None, continue_: str | None = None, namespace: str | None = None
    ) -> Page[dict[str, Any]]:
        """One page of the secrets (names and dates only), by name."""
        return await self.page(f"{self._ns(namespace)}/secrets", limit=limit, continue_=continue_)

    async def providers_page(
        self, *, limit: int | None = None, continue_: str | None = None, namespace: str | None = None
    ) -> Page[dict[str, Any]]:
        return await self.page(f"{self._ns(namespace)}/providers", limit=limit, continue_=continue_)

    async def modes_page(
        self, *, limit: int | None = None, continue_: str | None = None, namespace: str | None = None
    ) -> Page[dict[str, Any]]:
        return await self.page(f"{self._ns(namespace)}/modes", limit=limit, continue_=continue_)

    async def daemons_page(
        self, *, limit: int | None = None, continue_: str | None = None, namespace: str | None = None
    ) -> Page[DaemonJSON]:
        """One page of the daemons, by node."""
        return cast(
            Page[DaemonJSON],
            await self.page(f"{self._ns(namespace)}/daemons", limit=limit, continue_=continue_),
        )
