"""The database's own thread: it runs the functions the event loop hands it, one at a time, in
the order they were handed over, and gives each result back to the loop.

It replaces a one-worker :class:`concurrent.futures.ThreadPoolExecutor`, whose hand-off costs
the loop far more than the handing over needs: a submit takes two locks and makes a
:class:`concurrent.futures.Future` and a work item, ``run_in_executor`` wraps that future in
an asyncio one and chains the two with callbacks, and the worker settles it under a condition
variable. Here a call is one put on a :class:`queue.SimpleQueue` (written in C, no lock taken
by the loop) and one ``call_soon_threadsafe`` back. Every database call of the queue passes
through it (each group of writes, each read too big for the loop), several times per launch.

A call whose awaiting task is cancelled still runs (as a function the pool's worker had
started would): what it commits is committed, and its result is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_Job = tuple[Callable[..., Any], tuple[Any, ...], asyncio.AbstractEventLoop, "asyncio.Future[Any]"]


class ThreadClosedError(RuntimeError):
    """A call was handed to the thread after :meth:`DbThread.close`."""


def _settle(fut: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if fut.done():  # its caller was cancelled meanwhile
        return
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)


class DbThread:
    """One thread, started at once, that runs :meth:`call`'s functions in order."""

    def __init__(self, *, name: str) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._closed = False
        # A daemon thread: an interpreter that exits without close() is not held up by it (a
        # write cut short is rolled back by SQLite, as after a kill, and was never answered).
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the thread, after every call handed over before it; its result or
        its exception."""
        if self._closed:
            raise ThreadClosedError("the database thread is closed")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self._jobs.put((fn, args, loop, fut))
        return await fut

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, args, loop, fut = job
            try:
                value, ok = fn(*args), True
            except BaseException as exc:  # handed back to the caller, as an executor does
                value, ok = exc, False
            with contextlib.suppress(RuntimeError):  # a closed loop: no one waits for it
                loop.call_soon_threadsafe(_settle, fut, ok, value)
            del job, fn, args, loop, fut, value

    def close(self) -> None:
        """Run what was handed over already, then stop the thread and wait for it."""
        if self._closed:
            return
        self._closed = True
        self._jobs.put(None)
        self._thread.join()
