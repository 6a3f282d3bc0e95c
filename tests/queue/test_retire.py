"""A task given up on wakes the long-polls on its instance at once, whether the sweeper or a
claim settled it (not only at the poll's timeout)."""

from __future__ import annotations

import asyncio
import time

import pytest

from nymph.protocol import InstanceJSON
from nymph.queue.sql import retire
from tests.support.queue_helpers import Queue

POLL_WAIT = 20.0
#: Far below POLL_WAIT: a poll answered only at its timeout fails the test.
PROMPT = 6.0


async def _leased_once(q: Queue) -> tuple[str, int]:
    """Launch; let one daemon claim it with a 1 s lease (and die). Returns (instance, version)."""
    iid = (await q.user().launch(provider="kind", mode="small", script="print(1)"))["instanceId"]
    [task] = await q.daemon().claim(daemon_id="dies", node="n1", capacity=1, wait=0, lease_seconds=1)
    assert task["instanceId"] == iid
    inst = await q.user().get_instance(provider="kind", instance_id=iid)
    assert inst["state"] == "queued"
    return iid, inst["version"]


async def _poll(q: Queue, iid: str, version: int) -> tuple[InstanceJSON, float]:
    start = time.monotonic()
    inst = await q.user().get_instance(provider="kind", instance_id=iid, after=version, wait=POLL_WAIT)
    return inst, time.monotonic() - start


async def test_the_sweeper_giving_up_wakes_instance_polls(
    kind: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retire, "MAX_DELIVERIES", 1)
    iid, version = await _leased_once(kind)
    inst, elapsed = await _poll(kind, iid, version)  # the lease expires after 1 s; sweeps run every 0.2 s
    assert (inst["state"], inst["reason"]) == ("stopped", "LaunchFailed")
    assert elapsed < PROMPT, f"the poll was answered only after {elapsed:.1f}s"


async def test_a_claim_giving_up_wakes_instance_polls(
    no_sweeper: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retire, "MAX_DELIVERIES", 1)
    iid, version = await _leased_once(no_sweeper)
    poll = asyncio.create_task(_poll(no_sweeper, iid, version))
    await asyncio.sleep(1.2)  # the lease has expired; only a claim can settle the task now
    assert not poll.done()
    assert await no_sweeper.daemon().claim(daemon_id="next", node="n1", capacity=1, wait=0) == []
    inst, elapsed = await asyncio.wait_for(poll, POLL_WAIT + 5)
    assert (inst["state"], inst["reason"]) == ("stopped", "LaunchFailed")
    assert elapsed < PROMPT, f"the poll was answered only after {elapsed:.1f}s"
