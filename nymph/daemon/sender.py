"""The outbox's sender: reports, completions and logs go to the queue from here.

What the queue refuses for good is dropped (logged), never retried: a lost lease (409), an
instance it does not know (404), an invalid item (400), and a report, log chunk or log tail for
an instance this daemon does not run (403 ``not_instance_daemon``: another daemon applied it or
holds its task). The queue refuses a report batch whole when one of its reports is such; the
batch is then sent again one report at a time, so only the refused ones are dropped.

An outbox batch of completions and reports (see :func:`nymph.daemon.outboxitems.next_batch`)
goes out in a few requests, reports and completions in turn (:func:`~nymph.daemon.outboxitems.sends`),
each request for completions one ``POST /v1/dispatch/completions`` (or one ``complete`` each to a
queue without it). A request of it refused for good is dropped and the others still go. A run of log chunks goes out as one request
(``POST /v1/dispatch/logchunks/batch``, or one chunk each to a queue without it), each chunk
settled by its own answer: one refused for good is dropped (logged), one the queue cannot take
now keeps the whole run for a later try (a chunk sent twice changes nothing). Each completion's own answer
settles it as a single call's would; one the queue cannot take now (a 5xx, no answer) keeps the
whole batch for a later try, which the queue answers the same way (completions are idempotent
per task, reports per stream and seq).
"""

from __future__ import annotations

import base64
import time
from typing import Any

from nymph.client import (
    QueueBadRequest,
    QueueClient,
    QueueConflict,
    QueueError,
    QueueNotFound,
    QueueNotInstanceDaemon,
    QueueRegistrationRefused,
)
from nymph.daemon.leases import LeaseLedger
from nymph.daemon.metrics import Metrics
from nymph.daemon.outbox import Outbox
from nymph.daemon.outboxitems import DropItem, sends
from nymph.logsetup import get_logger

#: Outbox fields that are not part of the report the queue receives.
_LOCAL_FIELDS = ("kind", "stream", "_line", "_bytes")


class QueueSender:
    def __init__(
        self, *, daemon_id: str, client: QueueClient, leases: LeaseLedger, outbox: Outbox, metrics: Metrics
    ) -> None:
        self.daemon_id = daemon_id
        self.client = client
        self.leases = leases
        self.outbox = outbox
        self.metrics = metrics
        self.log = get_logger("sender", daemon=daemon_id)

    async def __call__(self, kind: str, batch: list[dict[str, Any]]) -> None:
        """Send one outbox batch; raise :class:`DropItem` for what the queue refuses for good."""
        t0 = time.monotonic()
        try:
            if kind in ("report", "complete"):
                for part, items in sends(batch):
                    await self._part(part, items, alone=len(batch) == len(items))
            elif kind == "logchunk":
                await self._chunks(batch)
            elif kind == "logs":
                item = batch[0]
                await self.client.upload_logs(
                    daemon_id=self.daemon_id, instance_id=item["instanceId"], logs=item["logs"]
                )
        except QueueRegistrationRefused:
            raise  # about the daemon, not the item: the outbox keeps it and retries
        except (QueueConflict, QueueNotFound, QueueBadRequest, QueueNotInstanceDaemon) as exc:
            raise DropItem(f"{kind}: {exc}") from exc
        finally:
            self.metrics.queue_seconds.labels(kind).observe(time.monotonic() - t0)
            self.metrics.reports_buffered.set(self.outbox.pending)

    async def _reports(self, batch: list[dict[str, Any]]) -> None:
        reports = [
            {k: v for k, v in item.items() if k not in _LOCAL_FIELDS and v is not None} for item in batch
        ]
        stream = batch[0]["stream"]
        try:
            await self.client.report(daemon_id=self.daemon_id, stream=stream, reports=reports)
            return
        except QueueNotInstanceDaemon:
            if len(reports) == 1:
                raise
        # One report refused the batch: send them one by one (in order; the queue applies each
        # once by its seq, so those it took before are not applied twice) and drop the refused.
        for report in reports:
            try:
                await self.client.report(daemon_id=self.daemon_id, stream=stream, reports=[report])
            except QueueNotInstanceDaemon as exc:
                self.log.warning(
                    "queue refused a report: not this daemon's instance; dropping it",
                    instance=report.get("instanceId"),
                    seq=report.get("seq"),
                    detail=str(exc)[:300],
                )

    async def _part(self, kind: str, items: list[dict[str, Any]], *, alone: bool) -> None:
        """One request of a batch of reports and completions. Refused for good, it is dropped
        (logged) and the batch's other requests still go (raised as :class:`DropItem` when it
        is the whole batch)."""
        try:
            if kind == "report":
                await self._reports(items)
            else:
                await self._completions(items)
        except QueueRegistrationRefused:
            raise
        except (QueueConflict, QueueNotFound, QueueBadRequest, QueueNotInstanceDaemon) as exc:
            if alone:
                raise
            self.log.warning(
                "queue refused a request of a batch; dropping it", kind=kind, detail=str(exc)[:300]
            )

    async def _chunks(self, items: list[dict[str, Any]]) -> None:
        """Ship log chunks in one request; drop (logged) each the queue refused for good."""
        chunks = [
            {
                "instance_id": item["instanceId"],
                "offset": int(item["offset"]),
                "data": base64.b64decode(item.get("data") or ""),
                "cursor": item.get("cursor"),
                "final": bool(item.get("final")),
                "note": item.get("note"),
            }
            for item in items
        ]
        if len(chunks) == 1:  # alone, as a single call: a refusal for good drops it (DropItem)
            await self.client.ship_log_chunk(daemon_id=self.daemon_id, **chunks[0])
            return
        answers = await self.client.ship_log_chunks(daemon_id=self.daemon_id, chunks=chunks)
        for item, answer in zip(items, answers, strict=True):
            if not isinstance(answer, QueueError):
                continue
            if isinstance(answer, (QueueConflict, QueueNotFound, QueueBadRequest, QueueNotInstanceDaemon)):
                self.log.warning(
                    "queue refused a log chunk; dropping it",
                    instance=item["instanceId"],
                    offset=item["offset"],
                    detail=str(answer)[:300],
                )
            else:
                raise answer  # not about the chunk (e.g. the session): kept, retried

    async def _completions(self, items: list[dict[str, Any]]) -> None:
        """Send ``items`` in one request; settle each the queue took or refused for good."""
        if not items:
            return
        completions = [
            {
                "task_id": item["taskId"],
                "ok": item["ok"],
                "error": item.get("error"),
                "retryable": bool(item.get("retryable")),
                "result": item.get("result"),
            }
            for item in items
        ]
        try:
            answers = await self.client.complete_many(daemon_id=self.daemon_id, completions=completions)
        except QueueRegistrationRefused:
            raise
        except (QueueConflict, QueueNotFound, QueueBadRequest):
            for item in items:  # the request refused whole, for good: as a single call's refusal
                self.leases.settled(item["taskId"])
            raise
        for item, answer in zip(items, answers, strict=True):
            if not isinstance(answer, QueueError):
                self.leases.settled(item["taskId"])
            elif isinstance(answer, QueueRegistrationRefused):
                raise answer  # about the daemon, not the item: kept, retried
            elif isinstance(answer, (QueueConflict, QueueNotFound, QueueBadRequest, QueueNotInstanceDaemon)):
                if not isinstance(answer, QueueNotInstanceDaemon):
                    self.leases.settled(item["taskId"])  # refused for good: the lease is not ours
                self.log.warning(
                    "queue refused a completion; dropping it", task=item["taskId"], detail=str(answer)[:300]
                )
            else:
                raise answer  # not settled (e.g. a 403 about the session): kept, retried
