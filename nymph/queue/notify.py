"""Wake-ups for long-polls: no sleeping polls, an event per change.

A waiter takes the current event *before* it reads the database and waits on it after; a
change that lands in between has already set that event, so no wake-up is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable


class Signal:
    """One broadcast signal: :meth:`notify` wakes everyone waiting on :meth:`current`."""

    def __init__(self, *, relay: Callable[[], None] | None = None) -> None:
        self._event = asyncio.Event()
        self.closed = False
        #: Passes each notify on to other replicas (``wake`` is how theirs arrive here).
        self._relay = relay

    def current(self) -> asyncio.Event:
        return self._event

    def notify(self) -> None:
        self.wake()
        if self._relay is not None:
            self._relay()

    def wake(self) -> None:
        """Wake the waiters of this process only."""
        event, self._event = self._event, asyncio.Event()
        event.set()

    def close(self) -> None:
        """Wake everyone for good (shutdown); later waits return at once."""
        self.closed = True
        self._event.set()


class KeyedSignal:
    """A signal per key (an instance id); entries are dropped when notified or abandoned."""

    def __init__(self, *, relay: Callable[[str], None] | None = None) -> None:
        self._events: dict[str, tuple[asyncio.Event, int]] = {}
        self.closed = False
        self._relay = relay

    def current(self, key: str) -> asyncio.Event:
        event, waiters = self._events.get(key, (None, 0))
        if event is None:
            event = asyncio.Event()
            if self.closed:
                event.set()
        self._events[key] = (event, waiters + 1)
        return event

    def release(self, key: str, event: asyncio.Event) -> None:
        """The waiter that took ``event`` for ``key`` is done with it."""
        entry = self._events.get(key)
        if entry is None or entry[0] is not event:
            return
        if entry[1] <= 1:
            del self._events[key]
        else:
            self._events[key] = (event, entry[1] - 1)

    def notify(self, key: str) -> None:
        self.wake(key)
        if self._relay is not None:
            self._relay(key)

    def wake(self, key: str) -> None:
        """Wake the waiters on ``key`` in this process only."""
        entry = self._events.pop(key, None)
        if entry is not None:
            entry[0].set()

    def close(self) -> None:
        self.closed = True
        for event, _ in self._events.values():
            event.set()
        self._events.clear()

    def __len__(self) -> int:
        return len(self._events)


async def wait_for_event(event: asyncio.Event, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds; True if the event was set."""
    if event.is_set():
        return True
    if timeout <= 0:
        return False
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            await event.wait()
    return event.is_set()
