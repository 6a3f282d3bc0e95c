"""Instances' output (logs and result files), behind async methods on the database thread.

Log chunks come from a daemon (``POST /v1/dispatch/logchunks``) or, for a direct launch, from
the queue's own follower; readers are woken per instance when a chunk lands
(:attr:`OutputStore.appended`). The sweeper calls :meth:`OutputStore.purge_due`, which removes
the output of instances stopped longer ago than the retention period.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from nymph.protocol import now
from nymph.queue.db import Backend
from nymph.queue.errors import Conflict, ServiceError
from nymph.queue.models import DaemonSession, OutputSettings
from nymph.queue.notify import KeyedSignal
from nymph.queue.sql import logchunks
from nymph.queue.sql import results as sql_results
from nymph.queue.sql.dialect import Conn
from nymph.queue.sql.instances import instance_row
from nymph.queue.sql.logchunks import LogRead, LogStatus

log = structlog.get_logger(__name__, component="queue.output")
#: The broadcast key prefix of "a log chunk landed for this instance" (other replicas wake its
#: followers).
LOG_KEY = "log:"


@dataclass(frozen=True)
class InstanceEnd:
    """What a log follower needs to know of the instance to decide the log is over."""

    state: str
    updated_at: float
    ran: bool


@dataclass(frozen=True)
class FollowRead:
    read: LogRead
    end: InstanceEnd


def _instance_end(conn: Conn, instance_id: str) -> InstanceEnd:
    row = conn.execute(
        "SELECT state, updated_at FROM instances WHERE instance_id = ?", (instance_id,)
    ).fetchone()
    ran = conn.execute(
        "SELECT 1 FROM instance_events WHERE instance_id = ? AND state = 'running' LIMIT 1", (instance_id,)
    ).fetchone()
    return InstanceEnd(state=str(row["state"]), updated_at=float(row["updated_at"]), ran=ran is not None)


def follow_over(read: FollowRead, *, at: float, grace: float) -> bool:
    """Whether a follower at ``read.read.next_offset`` has everything it will get (pure): the
    log is complete, or the instance stopped without ever running, or it stopped and no chunk
    came for ``grace`` seconds."""
    st, end = read.read.status, read.end
    if read.read.next_offset < st.total:
        return False
    if st.complete:
        return True
    if end.state != "stopped":
        return False
    if not end.ran and st.updated_at is None:
        return True
    last = max(end.updated_at, st.updated_at or 0.0)
    return at - last >= grace


class OutputStore:
    def __init__(self, *, db: Backend, settings: OutputSettings) -> None:
        self.db = db
        self.settings = settings
        #: Woken per instance id whenever a log chunk landed (here and, told through the
        #: database, on every other replica).
        self.appended = KeyedSignal(relay=lambda key: db.broadcast(f"{LOG_KEY}{key}"))
        self._next_purge = 0.0

    def close_waiters(self) -> None:
        self.appended.close()

    async def daemon_append(
        self,
        *,
        session: DaemonSession,
        instance_id: str,
        offset: int,
        data: bytes,
        cursor: str | None,
        final: bool,
        note: str | None,
    ) -> LogStatus:
        cap = self.settings.log_cap_bytes
        return await self._appended(
            instance_id,
            lambda conn: logchunks.daemon_append(
                conn,
                session=session,
                instance_id=instance_id,
                offset=offset,
                data=data,
                cap=cap,
                now=now(),
                cursor=cursor,
                final=final,
                note=note,
            ),
        )

    async def daemon_append_many(
        self, *, session: DaemonSession, chunks: list[logchunks.DaemonChunk]
    ) -> list[LogStatus | ServiceError]:
        """Many daemon chunks in one transaction, each answered alone (see
        :func:`~nymph.queue.sql.logchunks.daemon_append_many`); the followers of each instance
        a chunk landed for are woken once it is committed."""
        cap = self.settings.log_cap_bytes
        out = await self.db.write(
            lambda conn: logchunks.daemon_append_many(
                conn, session=session, chunks=chunks, cap=cap, now=now()
            )
        )
        for iid in dict.fromkeys(
            c.instance_id for c, st in zip(chunks, out, strict=True) if isinstance(st, LogStatus)
        ):
            self.appended.notify(iid)
        return out

    async def _appended(self, instance_id: str, write: Callable[[Conn], LogStatus]) -> LogStatus:
        """Run one chunk write and wake the instance's log followers."""
        st = await self.db.write(write)
        self.appended.notify(instance_id)
        return st

    async def append(
        self,
        *,
        instance_id: str,
        offset: int,
        data: bytes,
        cursor: str | None = None,
        final: bool = False,
        note: str | None = None,
    ) -> LogStatus:
        """The queue's own write (a direct launch's follower)."""
        cap = self.settings.log_cap_bytes
        return await self._appended(
            instance_id,
            lambda conn: logchunks.append(
                conn,
                instance_id=instance_id,
                offset=offset,
                data=data,
                cap=cap,
                now=now(),
                cursor=cursor,
                final=final,
                note=note,
            ),
        )

    async def status(self, *, instance_id: str) -> LogStatus | None:
        return await self.db.read_one(lambda conn: logchunks.status(conn, instance_id=instance_id))

    async def read_all(
        self, *, ns: str, provider: str, instance_id: str, since: int
    ) -> tuple[LogRead | None, str | None]:
        """The stored log from ``since`` (None without a log stream) and the tail an older
        daemon uploaded whole (None without one); 404 for an unknown instance."""

        def read(conn: Conn) -> tuple[LogRead | None, str | None]:
            instance_row(conn, ns=ns, provider=provider, instance_id=instance_id)
            tail = conn.execute(
                "SELECT text FROM instance_logs WHERE instance_id = ?", (instance_id,)
            ).fetchone()
            return logchunks.read_all(conn, instance_id=instance_id, since=since), (
                None if tail is None else str(tail[0])
            )

        return await self.db.read(read)

    async def follow_read(self, *, ns: str, provider: str, instance_id: str, since: int) -> FollowRead:
        def read(conn: Conn) -> FollowRead:
            instance_row(conn, ns=ns, provider=provider, instance_id=instance_id)
            return FollowRead(
                read=logchunks.read(conn, instance_id=instance_id, since=since),
                end=_instance_end(conn, instance_id),
            )

        return await self.db.read(read)

    # -- result files ---------------------------------------------------------------------------

    async def put_result(
        self,
        *,
        session: DaemonSession,
        instance_id: str,
        path: str | None,
        offset: int,
        data: bytes,
        eof: bool,
        error: str | None,
    ) -> int:
        cap = self.settings.results_cap_bytes
        size, refused = await self.db.write(
            lambda conn: sql_results.put_chunk(
                conn,
                session=session,
                instance_id=instance_id,
                path=path,
                offset=offset,
                data=data,
                eof=eof,
                error=error,
                cap=cap,
                now=now(),
            )
        )
        if refused is not None:
            raise Conflict(refused, code="results_too_large")
        return size

    async def results(self, *, ns: str, provider: str, instance_id: str) -> dict[str, Any]:
        return await self.db.read(
            lambda conn: sql_results.listing(conn, ns=ns, provider=provider, instance_id=instance_id)
        )

    async def result_size(self, *, ns: str, provider: str, instance_id: str, path: str) -> int:
        return await self.db.read(
            lambda conn: sql_results.file_size(
                conn, ns=ns, provider=provider, instance_id=instance_id, path=path
            )
        )

    async def result_chunks(self, *, instance_id: str, path: str, since: int) -> list[bytes]:
        return await self.db.read(
            lambda conn: sql_results.chunks(conn, instance_id=instance_id, path=path, since=since)
        )

    async def purge_due(self) -> int:
        """Remove expired output, at most once per ``purge_interval``; returns how many
        instances' output went."""
        t = now()
        if t < self._next_purge:
            return 0
        self._next_purge = t + self.settings.purge_interval
        before = t - self.settings.retention_seconds
        ids = await self.db.write(lambda conn: logchunks.purge(conn, stopped_before=before))
        if ids:
            log.info("expired output removed", instances=len(ids))
        return len(ids)
