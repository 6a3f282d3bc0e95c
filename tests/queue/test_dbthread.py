"""The database's own thread: calls run one at a time, in the order handed over, on that one
thread; each caller gets its own result or exception; a cancelled caller's call still runs; a
closed thread refuses new calls and is gone."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from nymph.queue.dbthread import DbThread, ThreadClosedError


async def test_calls_run_in_order_on_one_thread_and_each_gets_its_own_answer() -> None:
    worker = DbThread(name="nymph-test-db")
    seen: list[tuple[int, str]] = []

    def job(k: int) -> int:
        seen.append((k, threading.current_thread().name))
        if k % 5 == 2:
            raise ValueError(f"job {k} refused")
        time.sleep(0.001 if k % 3 == 0 else 0)
        return k * k

    try:
        got = await asyncio.gather(*(worker.call(job, k) for k in range(40)), return_exceptions=True)
    finally:
        worker.close()
    assert [k for k, _ in seen] == list(range(40))
    assert {name for _, name in seen} == {"nymph-test-db"}
    for k, out in enumerate(got):
        if k % 5 == 2:
            assert isinstance(out, ValueError) and str(out) == f"job {k} refused"
        else:
            assert out == k * k


async def test_a_cancelled_caller_leaves_its_call_to_run_and_later_calls_answered() -> None:
    worker = DbThread(name="nymph-test-db")
    release = threading.Event()
    ran: list[str] = []

    def slow() -> str:
        release.wait(5)
        ran.append("slow")
        return "slow"

    try:
        waiting = asyncio.ensure_future(worker.call(slow))
        await asyncio.sleep(0.01)
        waiting.cancel()
        after = asyncio.ensure_future(worker.call(lambda: ran.append("after") or "after"))
        release.set()
        assert await after == "after"
        assert ran == ["slow", "after"]
        with pytest.raises(asyncio.CancelledError):
            await waiting
    finally:
        worker.close()


async def test_a_closed_thread_refuses_calls_and_has_stopped() -> None:
    worker = DbThread(name="nymph-test-db-closed")
    assert await worker.call(lambda: 7) == 7
    worker.close()
    worker.close()  # twice is harmless
    assert "nymph-test-db-closed" not in {t.name for t in threading.enumerate()}
    with pytest.raises(ThreadClosedError, match="closed"):
        await worker.call(lambda: 1)
