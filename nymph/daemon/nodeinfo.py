"""What the daemon's node offers (labels, taints, allocatable), read from its own Node object.

The claimer sends the offer with every claim, so the queue hands this daemon only launches its
node can run (see :mod:`nymph.launch.placement`). Reading the Node takes the one cluster-scoped
permission the daemon has (``get`` on ``nodes``, a ClusterRole of its own). The offer is read
before the first claim and again every ``refresh`` seconds, so a relabelled or tainted node is
seen within that time. Without a node name, or when the Node cannot be read, the daemon sends no
offer (and the queue does not filter its claims).
"""

from __future__ import annotations

import asyncio
from typing import Any

from kubernetes_asyncio import client as kclient
from kubernetes_asyncio.client.exceptions import ApiException

from nymph.launch.placement import NodeOffer, node_offer
from nymph.logsetup import get_logger

#: How long the first claim waits for the node's offer before claiming without one.
FIRST_READ_TIMEOUT = 20.0


class NodeInfo:
    def __init__(self, *, api: kclient.ApiClient, node: str | None, refresh: float = 30.0) -> None:
        self.api = api
        self.node = node
        self.refresh = refresh
        self.offer: NodeOffer | None = None
        self.ready = asyncio.Event()
        self.log = get_logger("nodeinfo", node=node)

    def offer_json(self) -> dict[str, Any] | None:
        return None if self.offer is None else self.offer.to_json()

    async def read(self) -> NodeOffer | None:
        if not self.node:
            return None
        raw = await kclient.CoreV1Api(self.api).read_node(self.node)
        data: dict[str, Any] = self.api.sanitize_for_serialization(raw)
        return node_offer(data)

    async def run(self) -> None:
        if not self.node:
            self.ready.set()
            return
        failures = 0
        while True:
            try:
                offer = await self.read()
            except (TimeoutError, ApiException, OSError, ValueError) as exc:
                failures += 1
                status = getattr(exc, "status", None)
                self.log.warning(
                    "cannot read this node's labels, taints and allocatable; claims go without them"
                    + (" (is the nymph-daemon-nodes ClusterRole bound?)" if status == 403 else ""),
                    status=status,
                    error=str(exc)[:200],
                )
                # Forbidden or no such Node will not change soon: claim without an offer now.
                if failures >= 2 or status in (403, 404):
                    self.ready.set()
                await asyncio.sleep(min(self.refresh, 2.0 * failures))
                continue
            failures = 0
            if offer != self.offer:
                self.log.info(
                    "node offer",
                    labels=len(offer.labels) if offer else 0,
                    taints=[str(t) for t in offer.taints] if offer else [],
                    allocatable=offer.to_json()["allocatable"] if offer else {},
                )
            self.offer = offer
            self.ready.set()
            await asyncio.sleep(self.refresh)

    async def wait_ready(self) -> None:
        try:
            await asyncio.wait_for(self.ready.wait(), FIRST_READ_TIMEOUT)
        except TimeoutError:
            self.log.warning("node offer not read yet; claiming without it")
