"""Stop the daemon's Pods whose image cannot be pulled (see :mod:`nymph.launch.pullwait`).

:class:`PullWatch` is told every Pod event (before the tracker): it keeps, per Pod of this
node, since when its pull has been failing. Its loop (:meth:`PullWatch.run`) looks at those
clocks every :data:`CHECK_INTERVAL` seconds; a Pod failing longer than its image-pull timeout
(the Pod's annotation, else the daemon's default) is reported ``stopped`` / ``ImagePull`` with
what to check, then deleted (a delete that fails is left to the reaper, whose clock starts now).

The clocks are wall-clock times kept in ``<state dir>/image-pulls.json`` (rewritten whole when
one starts or clears, which is rare), so a restarted daemon keeps counting from when the pull
first failed instead of starting again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from nymph.daemon.audit import AuditLog, AuditWriteError
from nymph.daemon.durable import replace_atomically
from nymph.daemon.tracker import Report, Tracker
from nymph.kube.applier import Applier
from nymph.launch.pullwait import (
    DEFAULT_IMAGE_PULL_TIMEOUT,
    pod_pull_timeout,
    pull_expired,
    pull_since,
    pull_timeout_message,
)
from nymph.launch.state import InstanceState, Reason
from nymph.logsetup import get_logger

#: How often the clocks are looked at (seconds).
CHECK_INTERVAL = 1.0
STATE_FILE = "image-pulls.json"


def load_clocks(path: Path) -> dict[str, float]:
    """The clocks saved at ``path`` ({} when there is none or it cannot be read)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        str(k): float(v) for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
    }


class PullWatch:
    def __init__(
        self,
        *,
        tracker: Tracker,
        applier: Applier,
        audit: AuditLog,
        state_dir: Path,
        default_timeout: int = DEFAULT_IMAGE_PULL_TIMEOUT,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.tracker = tracker
        self.applier = applier
        self.audit = audit
        self.default_timeout = default_timeout
        self.clock = clock
        self.path = state_dir / STATE_FILE
        #: Pod name -> when its pull was first seen failing (wall clock).
        self.since: dict[str, float] = load_clocks(self.path)
        self.log = get_logger("image-pulls", node=tracker.node)

    def _save(self) -> None:
        # Best effort: without it a restarted daemon only starts the clock again.
        with contextlib.suppress(OSError):
            replace_atomically(self.path, json.dumps(self.since).encode(), durable=False)

    async def on_pod_event(self, kind: str, pod: Mapping[str, Any]) -> None:
        """The watch's callback: start, keep or clear the Pod's clock."""
        if not self.tracker.mine(pod):
            return
        name = str((pod.get("metadata") or {}).get("name") or "")
        previous = self.since.get(name)
        since = None if kind == "DELETED" else pull_since(pod, previous=previous, now=self.clock())
        if since == previous:
            return
        if since is None:
            del self.since[name]
        else:
            self.since[name] = since
        self._save()

    def expired(self, *, now: float) -> list[tuple[str, dict[str, Any], int]]:
        """(name, Pod, timeout) of each Pod whose pull has failed longer than its timeout."""
        out = []
        for name, since in list(self.since.items()):
            track = self.tracker.tracks.get(name)
            pod = None if track is None else self.tracker.pod_in_cache(track.namespace, name)
            if pod is None or track is None:
                if self.tracker.connected() and not self._cached(name):
                    del self.since[name]  # gone while the daemon was away
                continue
            if track.stopped or track.stop_requested or track.reaping:
                continue
            timeout = pod_pull_timeout(pod, default=self.default_timeout)
            if pull_expired(since=since, timeout=timeout, now=now):
                out.append((name, pod, timeout))
        return out

    def _cached(self, name: str) -> bool:
        return any(self.tracker.pod_in_cache(ns, name) is not None for ns in self.tracker.caches)

    async def check(self, *, now: float | None = None) -> list[str]:
        """Stop every Pod past its image-pull timeout; their names."""
        stopped = []
        for name, pod, timeout in self.expired(now=self.clock() if now is None else now):
            await self._stop(name, pod, timeout)
            stopped.append(name)
        return stopped

    async def _stop(self, name: str, pod: Mapping[str, Any], timeout: int) -> None:
        track = self.tracker.tracks[name]
        message = pull_timeout_message(pod, timeout=timeout)
        self.tracker.report(name, track, Report(InstanceState.STOPPED, Reason.IMAGE_PULL, message))
        # The reaper deletes it if this delete fails (a stopped Pod is reaped after its TTL).
        track.finished_at = time.monotonic()
        self.since.pop(name, None)
        self._save()
        try:
            deleted = await self.applier.delete_pod(namespace=track.namespace, name=name, grace_seconds=0)
            result = "image-pull-timeout" if deleted else "image-pull-timeout: already gone"
        except Exception as exc:
            result = f"image-pull-timeout: delete failed: {str(exc)[:200]}"
        with contextlib.suppress(AuditWriteError, OSError):
            self.audit.append(
                "delete", instance=name, namespace=track.namespace, node=self.tracker.node, result=result
            )
        self.log.warning("image could not be pulled in time; launch stopped", instance=name, timeout=timeout)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(CHECK_INTERVAL)
            if self.tracker.connected():
                await self.check()
