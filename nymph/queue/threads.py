"""The queue's worker threads for CPU work off the event loop (``asyncio.to_thread``).

asyncio's default executor is a :class:`~concurrent.futures.ThreadPoolExecutor`: ``asyncio.run``
waits for every job in it before it returns, and the interpreter joins its threads at exit,
so one long job kept a stopping queue alive after it said "stopped". :class:`BoundedExecutor`
has a fixed number of daemon threads; its shutdown cancels what has not started and never
waits for what has: a stopping queue exits within its grace period whatever a thread is doing.
(Renders of user input also have a budget of their own, so such a thread ends soon anyway:
:mod:`nymph.dockyard.spec.budget`.)
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

#: worker threads of a queue process
DEFAULT_WORKERS = 8
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
        self._workers = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(workers)
        ]
        self._started = False

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
