"""The daemon's node offer: read before the first claim, refreshed, and absent (not blocking)
when the daemon may not read its Node."""

from __future__ import annotations

import asyncio
import contextlib
from fractions import Fraction
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from nymph.daemon.nodeinfo import NodeInfo
from nymph.launch.placement import NodeOffer, Taint

OFFER = NodeOffer(
    name="gpu-1",
    labels={"gpu": "a100"},
    taints=(Taint(key="gpu", effect="NoSchedule"),),
    allocatable={"cpu": Fraction(8)},
)


async def _run_until_ready(info: NodeInfo) -> None:
    task = asyncio.create_task(info.run())
    try:
        await asyncio.wait_for(info.ready.wait(), 5)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_offer_is_read_and_sent_as_json() -> None:
    info = NodeInfo(api=None, node="gpu-1", refresh=0.05)  # type: ignore[arg-type]

    async def read() -> NodeOffer:
        return OFFER

    info.read = read  # type: ignore[method-assign]
    await _run_until_ready(info)
    assert info.offer_json() == {
        "name": "gpu-1",
        "labels": {"gpu": "a100"},
        "taints": [{"key": "gpu", "value": "", "effect": "NoSchedule"}],
        "allocatable": {"cpu": "8"},
    }


async def test_forbidden_means_no_offer_at_once() -> None:
    info = NodeInfo(api=None, node="n1", refresh=30)  # type: ignore[arg-type]

    async def read() -> Any:
        raise ApiException(status=403, reason="Forbidden")

    info.read = read  # type: ignore[method-assign]
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await _run_until_ready(info)
    assert loop.time() - t0 < 1.0
    assert info.offer_json() is None


async def test_no_node_name_means_no_offer() -> None:
    info = NodeInfo(api=None, node=None)  # type: ignore[arg-type]
    await _run_until_ready(info)
    assert info.offer_json() is None
