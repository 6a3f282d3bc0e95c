"""Restart safety: adopt our Pods (the watch listed them) and stop instances whose Pod is gone."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from nymph.client import QueueClient, QueueError
from nymph.daemon.audit import AuditLog
from nymph.daemon.leases import LeaseLedger
from nymph.daemon.tracker import Report, Tracker
from nymph.launch.state import InstanceState, Reason
from nymph.logsetup import get_logger


async def reconcile(
    *,
    node: str | None,
    client: QueueClient,
    tracker: Tracker,
    leases: LeaseLedger,
    audit: AuditLog,
    synced: Callable[[], Awaitable[object]],
    reconciled: asyncio.Event,
) -> None:
    """Run once every watch has listed its Pods (``await synced()``); set ``reconciled`` when done."""
    log = get_logger("reconcile", node=node)
    await synced()
    for ns, cache in tracker.caches.items():
        for name, pod in list(cache.cache.items()):
            if tracker.mine(pod):
                audit.append("adopt", instance=name, node=node, result="adopted-on-start", namespace=ns)
    if not node:
        reconciled.set()
        return
    backoff = 1.0
    while True:
        try:
            active = await client.active(node=node)
            break
        except QueueError as exc:
            log.warning("cannot reconcile with the queue yet", error=str(exc)[:200])
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 15)
    for item in active:
        iid = item["instanceId"]
        ns = item.get("kubeNamespace") or "default"
        if ns not in tracker.caches or tracker.pod_in_cache(ns, iid) is not None:
            continue
        if leases.holds_instance(iid):
            continue
        track = tracker.track(iid, namespace=ns)
        tracker.report(
            iid, track, Report(InstanceState.STOPPED, Reason.DELETED, "no Pod found when the daemon started")
        )
        tracker.forget(iid)
    reconciled.set()
    log.info("reconciled with the queue", active=len(active))
