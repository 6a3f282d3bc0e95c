"""The namespaces' event streams as the routes read them: a page after a cursor, and the signal
that wakes a follower (per namespace, here and, told through the database, on other replicas)
after a commit that added events (see :mod:`nymph.queue.sql.events`)."""

from __future__ import annotations

from collections.abc import Callable

from nymph.queue.db import Backend
from nymph.queue.notify import KeyedSignal
from nymph.queue.sql import events as sql
from nymph.queue.sql.dialect import Conn
from nymph.queue.sql.events import EventFilter, EventPage


class EventFeed:
    def __init__(self, *, db: Backend, relay: Callable[[str], None] | None = None) -> None:
        self.db = db
        #: Woken per namespace after each commit that added events to its stream.
        self.added = KeyedSignal(relay=relay)

    def written(self, namespaces: frozenset[str]) -> None:
        """A commit added events to these namespaces' streams: wake their followers."""
        for ns in sorted(namespaces):
            self.added.notify(ns)

    async def page(self, *, ns: str, after: int | None, limit: int, where: EventFilter) -> EventPage:
        """A page of ``ns``'s events after ``after``; events committed before this call are in it
        or after it, never left behind unsealed (PostgreSQL: they are sealed, then read)."""

        def read(conn: Conn) -> EventPage:
            return sql.read(conn, ns=ns, after=after, limit=limit, where=where)

        page = await self.db.read(read)
        if page.unsealed:
            await self.db.seal_events()
            page = await self.db.read(read)
        return page
