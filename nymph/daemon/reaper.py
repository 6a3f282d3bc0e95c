"""The reaper: a while after a Pod ends, keep its log, delete it and its workdir."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from nymph.daemon.audit import AuditLog, AuditWriteError
from nymph.daemon.diskhealth import DiskHealth
from nymph.daemon.metrics import Metrics
from nymph.daemon.outbox import Outbox
from nymph.daemon.settings import WorkSettings
from nymph.daemon.tracker import Track, Tracker
from nymph.daemon.workdirs import Workdirs
from nymph.kube.applier import Applier


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
        logs_settled: Callable[[str], bool] | None = None,
    ) -> None:
        self.w = settings
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

    def due(self, track: Track, *, now: float) -> bool:
        """Whether a finished Pod has waited long enough to be reaped."""
        return (
            track.finished_at is not None
            and not track.reaping
            and now - track.finished_at >= self.w.reap_after_seconds
        )

    async def run(self) -> None:
        interval = max(0.5, min(self.w.reap_after_seconds / 4, 30.0))
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for name, track in list(self.tracker.tracks.items()):
                if not self.due(track, now=now) or not self.logs_settled(name):
                    continue
                track.reaping = True
                try:
                    await self.reap(name, track)
                except (OSError, AuditWriteError) as exc:
                    # Its logs or its record could not be saved: try again on a later turn.
                    self.disk.failed("reaper", exc)
                    track.reaping = False

    async def reap(self, name: str, track: Track) -> None:
        try:
            text = await self.applier.pod_logs(
                namespace=track.namespace, name=name, limit_bytes=self.w.log_limit_bytes
            )
        except Exception as exc:
            text = f"(logs unavailable: {str(exc)[:200]})"
        self.outbox.logs(instance_id=name, text=text)
        result = "reaped"
        try:
            await self.applier.delete_pod(namespace=track.namespace, name=name, grace_seconds=0)
            self.metrics.reaped.labels("pod").inc()
        except Exception as exc:
            result = f"pod delete failed: {str(exc)[:200]}"
            track.reaping = False
            track.finished_at = time.monotonic()
        if self.workdirs.remove(name):
            self.metrics.reaped.labels("workdir").inc()
        self.audit.append("reap", instance=name, node=self.node, namespace=track.namespace, result=result)
