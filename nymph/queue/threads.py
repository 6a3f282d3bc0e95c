"""The queue's worker threads: the default executor (``asyncio.to_thread``) and the renders.

asyncio's default executor is a :class:`~concurrent.futures.ThreadPoolExecutor`: ``asyncio.run``
waits for every job in it before it returns, and the interpreter joins its threads at exit,
so one long job kept a stopping queue alive after it said "stopped". :class:`BoundedExecutor`
has a fixed number of daemon threads; its shutdown cancels what has not started and never
waits for what has: a stopping queue exits within its grace period whatever a thread is doing.

CPU-bound renders of user input (:func:`run_cpu`) have an executor of their own with as many
threads as it takes to keep a core busy, not more: under the GIL more threads would only starve
the event loop. A stopping queue shuts it first (:func:`stop_cpu`): renders not started are
answered "the queue is stopping" at once, the ones running end within their budget
(:mod:`nymph.dockyard.spec.budget`), so the grace period goes to the other requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

#: worker threads of a queue process
DEFAULT_WORKERS = 8
#: render threads of a queue process
CPU_WORKERS = 2
_Job = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class BoundedExecutor(ThreadPoolExecutor):
    """At most ``workers`` jobs at a time, each on a daemon thread named ``{name}-N``.

    A :class:`ThreadPoolExecutor` only in name (asyncio's ``set_default_executor`` takes no
    other): none of its machinery runs, so its exit hook has no thread of this one to join.
    """

    def __init__(self, *, workers: int = DEFAULT_WORKERS, name: str = "nymph-queue-worker") -> None:
        if workers < 1:
            raise ValueError("workers must be at least 1")
        super().__init__(max_workers=workers, thread_name_prefix=name)
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self.name = name
        self._workers = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(workers)
        ]
        self._started = False

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def threads(self) -> tuple[threading.Thread, ...]:
        return tuple(self._workers)

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new work after shutdown")
            if not self._started:
                self._started = True
                for thread in self._workers:
                    thread.start()
            fut: Future[T] = Future()
            self._jobs.put((fut, fn, args, kwargs))
            return fut

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fut, fn, args, kwargs = job
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # handed to the waiter, as ThreadPoolExecutor does
                fut.set_exception(exc)
            else:
                fut.set_result(result)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Cancel every job not started yet and stop the threads once they are idle; never
        waits for a running job (``wait`` and ``cancel_futures`` are accepted and ignored)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        with contextlib.suppress(queue.Empty):
            while True:
                job = self._jobs.get_nowait()
                if job is not None:
                    job[0].cancel()
        for _ in self._workers:
            self._jobs.put(None)


class Stopping(Exception):
    """A render was not started because the queue is stopping."""


_cpu: BoundedExecutor | None = None
_cpu_stopped = False
_cpu_lock = threading.Lock()


def cpu_executor() -> BoundedExecutor:
    """The process's render executor; raises :class:`Stopping` once :func:`stop_cpu` ran (until
    :func:`start_cpu`): a request that reaches its render after that is not rendered."""
    global _cpu
    with _cpu_lock:
        if _cpu_stopped:
            raise Stopping("the queue is stopping")
        if _cpu is None:
            _cpu = BoundedExecutor(workers=CPU_WORKERS, name="nymph-queue-render")
        return _cpu


def start_cpu() -> None:
    """Take renders (again): what a starting queue does."""
    global _cpu_stopped
    with _cpu_lock:
        _cpu_stopped = False


def stop_cpu() -> None:
    """Refuse every render not started yet, now and from now on; the running ones end on their
    own (their budget)."""
    global _cpu, _cpu_stopped
    with _cpu_lock:
        _cpu_stopped = True
        if _cpu is not None:
            _cpu.shutdown()
            _cpu = None


async def run_cpu(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on a render thread, in this context; raises :class:`Stopping`
    when the queue stops before it started (or has stopped). A caller that gives up frees its
    place."""
    ex = cpu_executor()
    ctx = contextvars.copy_context()
    try:
        fut = ex.submit(ctx.run, fn, *args, **kwargs)
    except RuntimeError:  # shut down between the two lines above
        raise Stopping("the queue is stopping") from None
    try:
        return await asyncio.wrap_future(fut)
    except asyncio.CancelledError:
        if fut.cancelled() and ex.closed:
            raise Stopping("the queue is stopping") from None
        fut.cancel()
        raise
