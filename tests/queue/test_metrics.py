"""The queue's Prometheus metrics: ``GET /metrics`` takes an admin token (a user or daemon token
is refused), counts each launch when a claim hands it out on its first attempt (measured from
its POST, inside the queue), not again when its lease expired and it is claimed a second time,
and shows how many claims hold a long-poll."""

from __future__ import annotations

import asyncio

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tests.support.queue_helpers import Queue


async def _scrape(q: Queue, token: str) -> tuple[int, dict[str, float]]:
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"{q.url}/metrics", headers={"Authorization": f"Bearer {token}"}) as resp,
    ):
        text = await resp.text()
        if resp.status != 200:
            return resp.status, {}
    values = {
        sample.name + "".join(f"{{{k}={v}}}" for k, v in sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    return 200, values


async def test_metrics_take_an_admin_token(kind: Queue) -> None:
    assert (await _scrape(kind, kind.user_token))[0] == 403
    assert (await _scrape(kind, kind.daemon_token))[0] == 403
    status, values = await _scrape(kind, kind.admin_token)
    assert status == 200 and values["nymph_queue_launch_claim_seconds_count"] == 0


async def test_a_launch_counts_once_from_post_to_its_first_claim(kind: Queue) -> None:
    d = kind.daemon()
    waiting = asyncio.create_task(d.claim(daemon_id="d1", node="n1", capacity=1, wait=10, lease_seconds=1))
    for _ in range(100):
        _, values = await _scrape(kind, kind.admin_token)
        if values["nymph_queue_claims_waiting"] == 1:
            break
        await asyncio.sleep(0.05)
    assert values["nymph_queue_claims_waiting"] == 1
    await kind.user().launch(provider="kind", mode="small", script="print(1)")
    [task] = await waiting
    _, values = await _scrape(kind, kind.admin_token)
    assert values["nymph_queue_launch_claim_seconds_count"] == 1
    assert 0 < values["nymph_queue_launch_claim_seconds_sum"] < 10
    assert values["nymph_queue_claims_waiting"] == 0
    # its lease runs out and it is claimed again: a second attempt, not a second launch
    [again] = await d.claim(daemon_id="d1", node="n1", capacity=1, wait=5)
    assert again["taskId"] == task["taskId"] and again["attempt"] == 2
    _, values = await _scrape(kind, kind.admin_token)
    assert values["nymph_queue_launch_claim_seconds_count"] == 1
