"""Fixtures for the queue tests.

``queue`` runs the service in the test's own event loop (for async tests); ``served`` runs it in
a background thread with its own loop (for the CLI and other synchronous callers). Both listen
on a free 127.0.0.1 port and keep their state in a SQLite file under ``tmp_path``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from queue_helpers import FAST, Queue, Served, add_kind, open_queue


@pytest.fixture
async def queue(tmp_path: Path) -> AsyncIterator[Queue]:
    q, runner = await open_queue(tmp_path, FAST)
    try:
        yield q
    finally:
        await q.close()
        await runner.cleanup()


@pytest.fixture
async def kind(queue: Queue) -> Queue:
    """The queue with provider ``kind`` (kube namespace ``jobs``) and mode ``small``."""
    await add_kind(queue)
    return queue


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="queue-under-test", daemon=True)
    thread.start()
    q, runner = asyncio.run_coroutine_threadsafe(open_queue(tmp_path, FAST), loop).result(30)
    try:
        yield Served(
            url=q.url, db_path=q.db_path, user_token=q.user_token, daemon_token=q.daemon_token, loop=loop
        )
    finally:
        asyncio.run_coroutine_threadsafe(q.close(), loop).result(10)
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
