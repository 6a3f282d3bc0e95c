"""Long-polls that run out end on a shared tick of the queue's clock, never later than asked
and early by at most a tick (and by at most a twentieth of the hold), so that many daemons'
idle re-polls arrive together instead of one at a time."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from pathlib import Path

import hypothesis
from hypothesis import strategies as st

from nymph.queue.models import QueueSettings
from nymph.queue.notify import hold_deadline
from tests.support.queue_helpers import FAST, add_kind, open_queue

TICK = 0.2
WAIT = 20 * TICK  # the shortest hold that is coalesced at this tick


def _ticking(tick: float) -> QueueSettings:
    return dataclasses.replace(FAST, poll=dataclasses.replace(FAST.poll, coalesce_seconds=tick))


def _off_tick(t: float) -> float:
    """How far the loop time ``t`` lies from the nearest tick, in seconds."""
    return abs(t / TICK - round(t / TICK)) * TICK


@hypothesis.given(
    start=st.floats(min_value=0, max_value=1e7, allow_nan=False),
    wait=st.floats(min_value=0, max_value=3600, allow_nan=False),
    tick=st.sampled_from([0.0, 0.05, 0.2, 1.0, 5.0]),
)
def test_a_hold_ends_on_a_tick_at_most_a_tick_and_a_twentieth_early(
    start: float, wait: float, tick: float
) -> None:
    end = hold_deadline(start, wait, tick=tick)
    assert end <= start + wait
    if tick == 0 or tick > wait / 20:
        assert end == start + wait
    else:
        assert end >= start + wait - tick - 1e-6
        assert end >= start + wait * (1 - 1 / 20) - 1e-6
        assert math.isclose(end / tick, round(end / tick), abs_tol=1e-6)


def test_holds_begun_within_one_tick_end_together() -> None:
    ends = {hold_deadline(100.0 + k * 0.01, 50.0, tick=1.0) for k in range(90)}
    assert ends == {150.0}
    assert hold_deadline(100.95, 50.0, tick=1.0) == 150.0
    assert hold_deadline(101.0, 50.0, tick=1.0) == 151.0


async def _spread_claims(tmp_path: Path, tick: float) -> list[tuple[float, float]]:
    """Four daemons' idle claims of WAIT seconds, sent 0.04 s apart just after a tick of the
    queue's clock (the queue runs on this loop): when each began and when its answer came."""
    q, runner = await open_queue(tmp_path, _ticking(tick))
    try:
        await add_kind(q)
        clients = [q.daemon() for _ in range(4)]
        for k, c in enumerate(clients):
            assert await c.claim(daemon_id=f"d{k}", node=f"n{k}", capacity=1, wait=0) == []
        loop = asyncio.get_running_loop()
        await asyncio.sleep(TICK - loop.time() % TICK + 0.01)

        async def hold(k: int) -> tuple[float, float]:
            await asyncio.sleep(0.04 * k)
            began = loop.time()
            assert await clients[k].claim(daemon_id=f"d{k}", node=f"n{k}", capacity=1, wait=WAIT) == []
            return began, loop.time()

        return list(await asyncio.gather(*(hold(k) for k in range(4))))
    finally:
        await runner.cleanup()
        await q.close()


async def test_idle_claims_sent_apart_are_answered_together_on_the_tick(tmp_path: Path) -> None:
    held = await _spread_claims(tmp_path, TICK)
    ends = [end for _, end in held]
    assert max(ends) - min(ends) < 0.06
    for began, end in held:
        assert WAIT - TICK - 0.05 <= end - began <= WAIT + 0.1
    assert _off_tick(min(ends)) < 0.05


async def test_without_a_tick_idle_claims_end_as_far_apart_as_they_began(tmp_path: Path) -> None:
    held = await _spread_claims(tmp_path, 0.0)
    ends = [end for _, end in held]
    assert max(ends) - min(ends) > 0.1
    for began, end in held:
        assert WAIT - 0.01 <= end - began <= WAIT + 0.1


async def test_an_instance_long_poll_also_ends_on_the_tick_and_not_late(tmp_path: Path) -> None:
    q, runner = await open_queue(tmp_path, _ticking(TICK))
    try:
        await add_kind(q)
        accepted = await q.user().launch(provider="kind", mode="small", script="print(1)")
        iid = str(accepted["instanceId"])
        loop = asyncio.get_running_loop()
        # Begun half a tick after one: the tick it ends on is half a tick before its full hold.
        await asyncio.sleep(TICK - loop.time() % TICK + TICK / 2)
        t0 = loop.time()
        got = await q.user().get_instance(provider="kind", instance_id=iid, after=5, wait=WAIT)
        end = loop.time()
        held = end - t0
        assert got["version"] == 1  # nothing changed: answered when the hold ran out
        assert WAIT - TICK <= held <= WAIT - TICK / 4
        assert _off_tick(end) < 0.05
    finally:
        await runner.cleanup()
        await q.close()
