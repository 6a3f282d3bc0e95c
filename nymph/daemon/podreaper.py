"""The reaper: a while after a Pod ends, keep its log, delete it and its workdir.

It also reaps orphaned workdirs: a workdir whose Pod does not exist (a launch killed before its
Pod was created, or whose apply failed for good; a Pod that went while the daemon was down) and
whose instance has no task in this daemon's hands is removed once it has been orphaned for
:func:`orphan_grace` (never while the Pod watches are disconnected: then nothing is known gone).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Iterable

from nymph.daemon.audit import AuditLog, AuditWriteError
from nymph.daemon.diskhealth import DiskHealth
from nymph.daemon.metrics import Metrics
from nymph.daemon.outbox import Outbox
from nymph.daemon.settings import WorkSettings
from nymph.daemon.tracker import Track, Tracker
from nymph.daemon.workdirs import Workdirs
from nymph.errors import NymphError
from nymph.kube.applier import Applier
from nymph.launch.names import check_instance_id

#: The shortest time a workdir must be orphaned before it is reaped (the Pod watch may lag an apply).
ORPHAN_GRACE_MIN = 10.0


def orphan_grace(settings: WorkSettings) -> float:
    """How long a workdir with no Pod and no task in hand waits before it is reaped."""
    return max(settings.reap_after_seconds, ORPHAN_GRACE_MIN)


def orphaned(names: Iterable[str], *, in_use: Callable[[str], bool]) -> list[str]:
    """The workdir ``names`` that are instance ids (nothing else under the root is ours to
    remove) and not ``in_use``."""
    out = []
    for name in names:
        try:
            check_instance_id(name)
        except NymphError:
            continue
        if not in_use(name):
            out.append(name)
    return out


#: Finished Pods reaped at once: each is a log read and a delete, so reaping keeps up with a
#: burst of launches without flooding the API server (or starting that many kubectl runs).
REAP_CONCURRENCY = 8


class Reaper:
    def __init__(
        self,
        *,
        settings: WorkSettings,
        node: str | None,
        tracker: Tracker,
        applier: Applier,
        outbox: Outbox,
        workdirs: Workdirs,
        audit: AuditLog,
        metrics: Metrics,
        disk: DiskHealth | None = None,
        busy: Callable[[], Collection[str]] = frozenset,
        logs_settled: Callable[[str], bool] | None = None,
        log_shipped: Callable[[str], bool] | None = None,
    ) -> None:
        self.w = settings
        #: The instance ids of the tasks this daemon holds (their workdirs are in use).
        self.busy = busy
        #: Orphaned workdir -> when it was first seen orphaned (monotonic).
        self.orphans: dict[str, float] = {}
        self.disk = disk or DiskHealth()
        self.node = node
        self.tracker = tracker
        self.applier = applier
        self.outbox = outbox
        self.workdirs = workdirs
        self.audit = audit
        self.metrics = metrics
        #: Whether all a Pod's output was shipped (the live log follower is done with it).
        self.logs_settled = logs_settled or (lambda _name: True)
        #: Whether the live follower shipped a Pod's log to its end, with output: the queue
        #: then serves that log, and a tail read at reap time would only repeat its end.
        self.log_shipped = log_shipped or (lambda _name: False)

    def due(self, name: str, track: Track, *, now: float) -> bool:
        """Whether a finished Pod has waited long enough to be reaped, and the queue has every
        report on it. A Pod reaped before the queue knows it ended would let a redelivery of its
        launch (a lease lost while the queue was away) create it again: the Pod is the proof
        that the launch ran, so it stays until its last report is sent."""
        return (
            track.finished_at is not None
            and not track.reaping
            and now - track.finished_at >= self.w.reap_after_seconds
            and not self.outbox.reporting(name)
            and not self.tracker.unsent(name)
        )

    async def run(self) -> None:
        interval = max(0.5, min(self.w.reap_after_seconds / 4, 30.0))
        while True:
            await asyncio.sleep(interval)
            if not self.tracker.connected():
                continue  # the API server is unreachable: nothing could be deleted, nothing is known gone
            await self.reap_due(now=time.monotonic())
            try:
                self.reap_orphans(now=time.monotonic())
            except (OSError, AuditWriteError) as exc:
                self.disk.failed("reaper", exc)

    async def reap_due(self, *, now: float, concurrency: int = REAP_CONCURRENCY) -> int:
        """Reap every Pod due at ``now``, ``concurrency`` at a time; how many were due."""
        due = [
            (name, t)
            for name, t in list(self.tracker.tracks.items())
            if self.due(name, t, now=now) and self.logs_settled(name)
        ]
        for _, track in due:
            track.reaping = True
        slots = asyncio.Semaphore(concurrency)

        async def one(name: str, track: Track) -> None:
            async with slots:
                try:
                    await self.reap(name, track)
                except (OSError, AuditWriteError) as exc:
                    # Its logs or its record could not be saved: try again on a later turn.
                    self.disk.failed("reaper", exc)
                    track.reaping = False

        await asyncio.gather(*(one(name, track) for name, track in due))
        return len(due)

    async def reap(self, name: str, track: Track) -> None:
        if not self.log_shipped(name):
            # The queue has no log of it to serve (the follower read none): keep its tail.
            try:
                text = await self.applier.pod_logs(
                    namespace=track.namespace, name=name, limit_bytes=self.w.log_limit_bytes
                )
            except Exception as exc:
                text = f"(logs unavailable: {str(exc)[:200]})"
            self.outbox.logs(instance_id=name, text=text)
        result = "reaped"
        # The Pod as the watch last saw it: the delete is bound to its uid, with no read first.
        pod = self.tracker.pod_in_cache(track.namespace, name)
        uid = (pod.get("metadata") or {}).get("uid") if pod is not None else None
        try:
            await self.applier.delete_pod(
                namespace=track.namespace, name=name, grace_seconds=0, uid=str(uid) if uid else None
            )
            self.metrics.reaped.labels("pod").inc()
        except Exception as exc:
            result = f"pod delete failed: {str(exc)[:200]}"
            track.reaping = False
            track.finished_at = time.monotonic()
        if self.workdirs.remove(name):
            self.metrics.reaped.labels("workdir").inc()
        self.audit.append("reap", instance=name, node=self.node, namespace=track.namespace, result=result)

    def _in_use(self, name: str, busy: Collection[str]) -> bool:
        return name in busy or any(
            self.tracker.pod_in_cache(ns, name) is not None for ns in self.tracker.caches
        )

    def reap_orphans(self, *, now: float) -> list[str]:
        """Remove the workdirs orphaned for the grace period; returns their names."""
        if not self.tracker.connected():
            self.orphans.clear()  # the caches may be stale: restart every clock once they are not
            return []
        busy = self.busy()
        found = orphaned(self.workdirs.existing(), in_use=lambda n: self._in_use(n, busy))
        self.orphans = {name: self.orphans.get(name, now) for name in found}
        grace = orphan_grace(self.w)
        reaped = []
        for name, since in list(self.orphans.items()):
            if now - since < grace:
                continue
            del self.orphans[name]
            if self.workdirs.remove(name):
                self.metrics.reaped.labels("workdir").inc()
                self.audit.append("reap", instance=name, node=self.node, result="orphaned workdir removed")
                reaped.append(name)
        return reaped
