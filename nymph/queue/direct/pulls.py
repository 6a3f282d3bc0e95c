"""Direct Pods whose image cannot be pulled are stopped after their image-pull timeout (see
:mod:`nymph.launch.pullwait`): a named background task beside the watches, on the replica that
runs them. Since when a pull fails is the queue's own history (the entry that moved the instance
to ``starting`` / ``ImagePull``), so a restarted queue keeps counting; the timeout is the Pod's
annotation, else the queue's ``--image-pull-timeout``."""

from __future__ import annotations

import asyncio
import json

import structlog

from nymph.kube import pods
from nymph.kube.pods import Connection
from nymph.launch.pullwait import pod_pull_timeout, pull_expired, pull_timeout_message
from nymph.protocol import now
from nymph.queue.direct.connect import Connector
from nymph.queue.store import Store

log = structlog.get_logger(__name__, component="queue.direct.pulls")


class PullTimeouts:
    def __init__(self, *, store: Store, connector: Connector, interval: float) -> None:
        self.store = store
        self.connector = connector
        self.interval = interval

    async def check(self, *, at: float | None = None) -> list[str]:
        """End every direct instance past its image-pull timeout and delete its Pod; their ids."""
        ts = now() if at is None else at
        default = self.store.settings.launch.image_pull_timeout
        ended = []
        for f in await self.store.direct.failing_pulls():
            pod = json.loads(f.pod)
            timeout = pod_pull_timeout(pod, default=default)
            if not pull_expired(since=f.since, timeout=timeout, now=ts):
                continue
            message = pull_timeout_message(pod, timeout=timeout)
            if not await self.store.direct.end_pull(instance_id=f.instance_id, message=message, ts=ts):
                continue
            self.store.instance_changed.notify(f.instance_id)
            ended.append(f.instance_id)
            log.warning("image could not be pulled in time; launch stopped", instance=f.instance_id)
            conn = Connection.from_json(json.loads(f.connection))
            try:
                async with self.connector.api(
                    ns=f.namespace, conn=conn, what=f"deleting Pod {f.instance_id}"
                ) as api:
                    await pods.delete_pod(api, namespace=conn.namespace, name=f.instance_id, grace_seconds=0)
            except Exception as exc:  # the reaper deletes it later (it is stopped now)
                detail = getattr(exc, "detail", None) or exc.__class__.__name__
                log.warning("delete failed; the reaper will retry", instance=f.instance_id, error=detail)
        return ended

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.check()
            except Exception:
                log.exception("image-pull check failed; retrying")
