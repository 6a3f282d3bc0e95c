"""The outbox with log chunks: bounded memory, backpressure on the log budget, compaction of
the file, and a restart that resumes in order after a compaction."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

from nymph.daemon.outbox import Outbox

IID = "lakeshore-0000000a"


async def test_log_chunks_are_throttled_by_the_budget_and_held_on_disk(tmp_path: Path) -> None:
    box = Outbox(tmp_path, memory_bytes=3000, log_budget=5000)
    for i in range(3):
        box.log_chunk(instance_id=IID, offset=i * 1500, data=b"x" * 1500)
    # 3 x 2000 base64 bytes: memory keeps what fits, the rest waits on disk; the budget is full
    assert box.mem_bytes <= 3000 and box.backlog == 2 and box.log_bytes == 6000
    waiter = asyncio.create_task(box.wait_log_room())
    await asyncio.sleep(0.05)
    assert not waiter.done()  # a follower would stop reading here
    sent: list[int] = []
    release = asyncio.Event()

    async def send(kind: str, batch: list[dict[str, Any]]) -> None:
        await release.wait()
        assert kind == "logchunk"
        sent.extend(len(base64.b64decode(b["data"])) for b in batch)

    task = asyncio.create_task(box.run(send))
    release.set()
    await asyncio.wait_for(waiter, 5)
    assert await box.flush(timeout=5)
    task.cancel()
    assert sent == [1500, 1500, 1500] and box.log_bytes == 0 and box.mem_bytes == 0


async def test_compaction_keeps_the_unsent_lines_across_a_restart(tmp_path: Path) -> None:
    box = Outbox(tmp_path, compact_after=5)
    for i in range(12):
        box.report(instance_id=IID, state="running", message=str(i))
    first: list[str] = []

    async def send_seven(kind: str, batch: list[dict[str, Any]]) -> None:
        if len(first) >= 7:
            raise OSError("the queue went away")
        first.extend(b["message"] for b in batch)

    box.batch_max = 1
    task = asyncio.create_task(box.run(send_seven))
    await asyncio.sleep(0.3)
    task.cancel()
    assert first == [str(i) for i in range(7)]
    lines = (tmp_path / "outbox.jsonl").read_text().splitlines()
    assert len(lines) < 12  # compacted: the sent lines are gone from the file
    # written after the compaction: to the file it put in place (the outbox holds its file open)
    box.report(instance_id=IID, state="stopped", message="after the compaction")
    again = Outbox(tmp_path)
    rest: list[str] = []

    async def send(kind: str, batch: list[dict[str, Any]]) -> None:
        rest.extend(b["message"] for b in batch)

    task = asyncio.create_task(again.run(send))
    assert await again.flush(timeout=5)
    task.cancel()
    assert rest == [*(str(i) for i in range(7, 12)), "after the compaction"]
