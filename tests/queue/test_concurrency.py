"""Many daemons claiming at once never share a task while its lease lives."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from tests.support.queue_helpers import Queue

TASKS = 1000
DAEMONS = 20


async def test_concurrent_claimers_never_double_claim(kind: Queue) -> None:
    claimed: list[tuple[str, str]] = []
    done = asyncio.Event()

    async def daemon(n: int) -> None:
        client = kind.daemon()
        while not done.is_set():
            tasks = await client.claim(
                daemon_id=f"d{n}", node=f"n{n % 3}", capacity=7, wait=1, lease_seconds=120
            )
            claimed.extend((t["taskId"], f"d{n}") for t in tasks)
            if len(claimed) >= TASKS:
                done.set()

    async def launcher(k: int) -> list[str]:
        user = kind.user()
        return [
            (await user.launch(provider="kind", mode="small", script=f"print({i})"))["instanceId"]
            for i in range(k, TASKS, 10)
        ]

    t0 = time.monotonic()
    # Claimers start first and hold long-polls while the launches pour in.
    claimers = [asyncio.create_task(daemon(n)) for n in range(DAEMONS)]
    launched = [iid for chunk in await asyncio.gather(*(launcher(k) for k in range(10))) for iid in chunk]
    await asyncio.wait_for(done.wait(), 60)
    await asyncio.gather(*claimers)
    elapsed = time.monotonic() - t0

    counts = Counter(task_id for task_id, _ in claimed)
    assert len(launched) == len(set(launched)) == TASKS
    assert len(counts) == TASKS
    assert max(counts.values()) == 1, [t for t, c in counts.items() if c > 1][:5]
    # Nothing is left to claim.
    assert await kind.daemon().claim(daemon_id="late", node="n0", capacity=100, wait=0) == []
    assert elapsed < 60
