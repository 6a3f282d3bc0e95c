"""Namespaces' scheduling settings and usage, read and set through the database (the HTTP side
is :mod:`nymph.queue.http.routes.quota`)."""

from __future__ import annotations

from typing import Any

from nymph.protocol import now
from nymph.queue import quotas
from nymph.queue.db import Backend
from nymph.queue.scheduling import Quota, Usage
from nymph.queue.sql import quotas as sql_quotas
from nymph.queue.sql import schedule
from nymph.queue.sql.dialect import NAMESPACE_KEYS, Conn, lock_key


class QuotaBook:
    def __init__(self, *, db: Backend) -> None:
        self._db = db

    async def get(self, ns: str) -> dict[str, Any]:
        def read(conn: Conn) -> dict[str, Any]:
            return quotas.quota_json(
                ns, sql_quotas.get_quota(conn, ns), schedule.usage(conn).get(ns, Usage())
            )

        return await self._db.read(read)

    async def put(self, ns: str, body: object) -> dict[str, Any]:
        """Merge ``body`` into the namespace's settings (a ValidationError names a bad key)."""

        def write(conn: Conn) -> dict[str, Any]:
            lock_key(conn, NAMESPACE_KEYS, ns)  # two merges of one namespace: one after the other
            merged = quotas.merge(sql_quotas.get_quota(conn, ns), body)
            sql_quotas.put_quota(conn, ns, merged, now=now())
            return quotas.quota_json(ns, merged, schedule.usage(conn).get(ns, Usage()))

        return await self._db.write(write)

    async def list(self) -> list[dict[str, Any]]:
        """Every namespace with settings or launches running, by name."""

        def read(conn: Conn) -> list[dict[str, Any]]:
            have = sql_quotas.all_quotas(conn)
            held = schedule.usage(conn)
            return [
                quotas.quota_json(ns, have.get(ns, Quota()), held.get(ns, Usage()))
                for ns in sorted({*have, *held})
            ]

        return await self._db.read(read)
