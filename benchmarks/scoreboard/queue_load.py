"""The queue alone: claims/s, POST latency and the queue's CPU with 1, 10, 100 daemons holding
long-polls (no cluster: the claimed tasks are never run)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

from benchmarks.scoreboard import procstat
from benchmarks.scoreboard.kube import latency_summary, new_queue
from nymph.client import QueueClient
from tests.support.harness import QueueProc


async def _pollers(
    q: QueueProc, d: int, claimed: dict[str, float], stop: asyncio.Event
) -> list[asyncio.Task[None]]:
    async def poller(k: int) -> None:
        async with QueueClient(base_url=q.url, token=q.daemon_token) as c:
            while not stop.is_set():
                with contextlib.suppress(Exception):
                    tasks = await c.claim(
                        daemon_id=f"poller-{d}-{k}",
                        node=f"node-{d}-{k}",
                        capacity=1,
                        wait=30,
                        lease_seconds=600,
                    )
                    now = time.monotonic()
                    for t in tasks:
                        claimed[str(t["instanceId"])] = now

    return [asyncio.create_task(poller(k)) for k in range(d)]


async def _all_claimed(ids: list[str], claimed: dict[str, float], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not set(ids) <= claimed.keys():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(set(ids) - claimed.keys())} launches never claimed")
        await asyncio.sleep(0.01)


async def one(q: QueueProc, *, daemons: int, launches: int, paced_seconds: float) -> dict[str, Any]:
    claimed: dict[str, float] = {}
    stop = asyncio.Event()
    tasks = await _pollers(q, daemons, claimed, stop)
    assert q.proc is not None
    pid = {"queue": q.proc.pid}
    try:
        await asyncio.sleep(1.0 + daemons / 50)  # every poller registered and holding a claim
        post_ms: list[float] = []
        async with q.client() as c:
            ids: list[str] = []
            before = procstat.snapshot(pid)
            t0 = time.monotonic()
            for _ in range(launches):
                t = time.monotonic()
                acc = await c.launch(provider="bench", mode="tiny", script="print(1)\n")
                post_ms.append((time.monotonic() - t) * 1000)
                ids.append(str(acc["instanceId"]))
            await _all_claimed(ids, claimed)
            t_end = max(claimed[i] for i in ids)
            burst_cpu = procstat.cpu_delta(before, procstat.snapshot(pid))["queue"]
            paced: dict[str, Any] = {}
            if paced_seconds > 0:
                # 5 launches/s, as a busy cluster might post them, while every poller waits.
                before = procstat.snapshot(pid)
                t1 = time.monotonic()
                for k in range(int(paced_seconds * 5)):
                    await asyncio.sleep(max(0.0, t1 + k / 5 - time.monotonic()))
                    await c.launch(provider="bench", mode="tiny", script="print(1)\n")
                await asyncio.sleep(max(0.0, t1 + paced_seconds - time.monotonic()))
                spent = procstat.cpu_delta(before, procstat.snapshot(pid))["queue"]
                paced = {"queue_cpu_pct_at_5_launches_per_s": round(100 * spent / (time.monotonic() - t1), 1)}
    finally:
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {
        "daemons": daemons,
        "launches": launches,
        "claims_per_s": round(launches / max(t_end - t0, 1e-6), 1),
        "post": latency_summary(post_ms),
        "queue_cpu_ms_per_launch": round(burst_cpu * 1000 / launches, 2),
        **paced,
    }


async def run(tmp: Path, *, daemon_counts: list[int], launches: int, paced_seconds: float) -> dict[str, Any]:
    """One queue; for each count, that many pollers (fresh ones) and a fresh burst of launches."""
    out: dict[str, Any] = {}
    home = tmp / "queue-load"
    home.mkdir(parents=True, exist_ok=True)
    q = new_queue(home / "queue.db")
    try:
        async with q.client() as c:
            await c.create_provider(name="bench", kwargs={"namespace": "bench"}, dispatch="daemon")
            await c.create_mode(name="tiny", provider="bench", fields={"image": "busybox"})
        for d in daemon_counts:
            out[str(d)] = await one(q, daemons=d, launches=launches, paced_seconds=paced_seconds)
            print(f"  queue: {d:>3} pollers  {out[str(d)]['claims_per_s']:>8} claims/s", flush=True)
    finally:
        q.kill()
    return out
