"""The expiry of stopped instances, run by the lease sweeper (the queue's named, guarded
background task) once per ``purge_interval``: instances stopped longer ago than
``--retention-days`` are deleted in bounded batches, each its own write transaction, with the
rows that hang off them; their tombstones go after ``tombstone_seconds`` (see
:mod:`nymph.queue.sql.expiry`). Events older than the retention period go in the same pass, the
oldest first (:func:`nymph.queue.sql.events.prune`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import structlog

from nymph.protocol import now
from nymph.queue.db import Backend
from nymph.queue.models import OutputSettings
from nymph.queue.sql import events
from nymph.queue.sql import expiry as sql

log = structlog.get_logger(__name__, component="queue.expiry")
#: Events removed per transaction, per instance of ``expire_batch`` (an instance has a few).
EVENTS_PER_INSTANCE = 10


@dataclass(frozen=True)
class ExpiryPass:
    """What one pass removed; ``more`` when it stopped at its bound with more left."""

    instances: int = 0
    tombstones: int = 0
    more: bool = False
    events: int = 0


class InstanceExpiry:
    def __init__(self, *, db: Backend, settings: OutputSettings, clock: Callable[[], float] = now) -> None:
        self.db = db
        self.settings = settings
        #: The time source (tests move it forward).
        self.clock = clock
        self._next = 0.0

    async def due(self) -> ExpiryPass:
        """A pass, at most once per ``purge_interval`` (an empty pass when not due)."""
        t = self.clock()
        if t < self._next:
            return ExpiryPass()
        self._next = t + self.settings.purge_interval
        return await self.run(at=t)

    async def run(self, *, at: float) -> ExpiryPass:
        s = self.settings
        before = at - s.retention_seconds
        removed = 0
        more = False
        for _ in range(max(1, s.expire_batches)):
            ids = await self.db.write(
                lambda conn: sql.expire(conn, stopped_before=before, now=at, limit=s.expire_batch)
            )
            removed += len(ids)
            more = len(ids) >= s.expire_batch
            if not more:
                break
        pruned = await self.db.write(
            lambda conn: sql.prune_tombstones(
                conn, expired_before=at - s.tombstone_seconds, limit=s.expire_batch
            )
        )
        gone = 0
        for _ in range(max(1, s.expire_batches)):
            batch = await self.db.write(
                lambda conn: events.prune(conn, before=before, limit=s.expire_batch * EVENTS_PER_INSTANCE)
            )
            gone += batch
            if batch < s.expire_batch * EVENTS_PER_INSTANCE:
                break
        if removed or pruned or gone:
            log.info(
                "expired instances removed", instances=removed, tombstones=pruned, events=gone, more=more
            )
        return ExpiryPass(instances=removed, tombstones=pruned, more=more, events=gone)
