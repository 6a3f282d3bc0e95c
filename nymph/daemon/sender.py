"""The outbox's sender: reports, completions and logs go to the queue from here."""

from __future__ import annotations

import base64
import time
from typing import Any

from nymph.client import QueueBadRequest, QueueClient, QueueConflict, QueueNotFound, QueueRegistrationRefused
from nymph.daemon.claimer import Claimer
from nymph.daemon.metrics import Metrics
from nymph.daemon.outbox import DropItem, Outbox

#: Outbox fields that are not part of the report the queue receives.
_LOCAL_FIELDS = ("kind", "stream", "_line", "_bytes")


class QueueSender:
    def __init__(
        self, *, daemon_id: str, client: QueueClient, claimer: Claimer, outbox: Outbox, metrics: Metrics
    ) -> None:
        self.daemon_id = daemon_id
        self.client = client
        self.claimer = claimer
        self.outbox = outbox
        self.metrics = metrics

    async def __call__(self, kind: str, batch: list[dict[str, Any]]) -> None:
        """Send one outbox batch; raise :class:`DropItem` for what the queue refuses for good."""
        t0 = time.monotonic()
        try:
            if kind == "report":
                reports = [
                    {k: v for k, v in item.items() if k not in _LOCAL_FIELDS and v is not None}
                    for item in batch
                ]
                await self.client.report(daemon_id=self.daemon_id, stream=batch[0]["stream"], reports=reports)
            elif kind == "complete":
                await self._complete(batch[0])
            elif kind == "logchunk":
                item = batch[0]
                await self.client.ship_log_chunk(
                    daemon_id=self.daemon_id,
                    instance_id=item["instanceId"],
                    offset=int(item["offset"]),
                    data=base64.b64decode(item.get("data") or ""),
                    cursor=item.get("cursor"),
                    final=bool(item.get("final")),
                    note=item.get("note"),
                )
            elif kind == "logs":
                item = batch[0]
                await self.client.upload_logs(
                    daemon_id=self.daemon_id, instance_id=item["instanceId"], logs=item["logs"]
                )
        except QueueRegistrationRefused:
            raise  # about the daemon, not the item: the outbox keeps it and retries
        except (QueueConflict, QueueNotFound, QueueBadRequest) as exc:
            raise DropItem(f"{kind}: {exc}") from exc
        finally:
            self.metrics.queue_seconds.labels(kind).observe(time.monotonic() - t0)
            self.metrics.reports_buffered.set(self.outbox.pending)

    async def _complete(self, item: dict[str, Any]) -> None:
        try:
            await self.client.complete(
                daemon_id=self.daemon_id,
                task_id=item["taskId"],
                ok=item["ok"],
                error=item.get("error"),
                retryable=bool(item.get("retryable")),
                result=item.get("result"),
            )
        except (QueueConflict, QueueNotFound, QueueBadRequest):
            self.claimer.settled(item["taskId"])  # refused for good: the lease is not ours
            raise
        self.claimer.settled(item["taskId"])
