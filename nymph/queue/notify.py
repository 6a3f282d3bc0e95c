"""Wake-ups for long-polls: no sleeping polls, an event per change.

A waiter takes the current event *before* it reads the database and waits on it after; a
change that lands in between has already set that event, so no wake-up is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


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


@dataclass(eq=False)
class Ticket:
    """One waiting claim's place in line. ``wake`` is set when it is woken: how many more
    waiters the wake may still be handed to if this one finds nothing it can take."""

    event: asyncio.Event = field(default_factory=asyncio.Event)
    wake: int | None = None
    done: bool = False
    #: Still in the line (waiting to be woken, or finished and not swept out yet).
    queued: bool = False
    #: The notifies there had been when it was taken: its claim reads after them, so it has
    #: seen their work.
    seen: int = 0
    #: The notify whose work the wake it carries is for (its count of notifies).
    wake_for: int = 0
    #: What that work is (None: not told), handed on with the wake.
    wake_item: Any = None
    #: Whether its claim may take a piece of work (None: any); a wake for work it may not
    #: take passes it by (:mod:`nymph.queue.wakeup`).
    accepts: Callable[[Any], bool] | None = None
    #: The group of waiters its ``accepts`` answers with (see :class:`WorkSignal`), while it
    #: waits in line; None: it answers alone.
    group: object = None


#: Finished tickets a line keeps at least before sweeping them out.
_SWEEP_AT = 64


class WorkSignal:
    """Wakes waiting claims one per unit of new work, not all of them.

    A claim takes a :meth:`ticket` *before* it reads the database and waits on it after, so
    work that lands in between wakes it (no wake-up is lost). :meth:`notify` wakes as many
    waiters as there are new tasks, first come first woken. A woken claim that finds nothing
    it may take (another node, another namespace) hands the wake on with :meth:`pass_on`, to
    at most as many waiters as were waiting when the work arrived, so a task only some
    daemons can run still reaches one of them, and a task none can run stops travelling.

    A notify may say what the work is: its wakes then go only to waiters whose claims may take
    it (:mod:`nymph.queue.wakeup`), the others keep their place. A wake goes only to a waiter
    that took its ticket before the work's notify: one taken since has read the work already
    and found nothing for it. Tickets join the line in the order they are taken, so once the
    first waiter in line has seen the work, all have, and the wake stops there. Without this,
    each of a burst of tasks that no waiter can take travelled through every waiter (500 such
    tasks and 1,000 daemons: half a million claims read), though each waiter read all of them
    at its first wake.

    An ``accepts`` may belong to a group of waiters that answer alike (its ``group``, a key,
    and ``group_may(item)``, False only when no waiter of the group may take ``item``): the
    waiters in line are counted by group, and a wake for work that no group in line may take
    ends at once, instead of asking each of a thousand waiters in turn.
    """

    def __init__(self, *, relay: Callable[[int | None, Any], None] | None = None) -> None:
        self._line: deque[Ticket] = deque()
        #: Passes each notify on to other replicas (a count and what the work is, or None and
        #: None for all); ``wake`` and ``wake_all`` are how theirs arrive here.
        self._relay = relay
        self._aside: set[Ticket] = set()  # waiters that take no work (capacity 0): only closing wakes them
        #: Finished tickets still in the line: left there (taking one out of a line of a thousand
        #: waiters is a scan) until they outnumber the live ones, then swept out at once.
        self._dead = 0
        #: Notifies so far (here or relayed): a ticket's ``seen``, a wake's ``wake_for``.
        self._notified = 0
        #: The waiters in line that have not finished, by group: group -> [how many, the
        #: ``accepts`` of one of them]; and how many answer alone (no group).
        self._groups: dict[object, list[Any]] = {}
        self._alone = 0
        self.closed = False

    def ticket(self, *, in_line: bool = True, accepts: Callable[[Any], bool] | None = None) -> Ticket:
        t = Ticket(seen=self._notified, accepts=accepts)
        if self.closed:
            t.wake = 0
            t.event.set()
        elif in_line:
            t.queued = True
            self._line.append(t)
            self._enter(t)
        else:
            self._aside.add(t)
        return t

    def _enter(self, t: Ticket) -> None:
        group = getattr(t.accepts, "group", None) if hasattr(t.accepts, "group_may") else None
        t.group = group
        if group is None:
            self._alone += 1
            return
        entry = self._groups.get(group)
        if entry is None:
            self._groups[group] = [1, t.accepts]
        else:
            entry[0] += 1

    def _leave(self, t: Ticket) -> None:
        """``t`` no longer waits in line (woken, or finished)."""
        if t.group is None:
            self._alone -= 1
            return
        entry = self._groups[t.group]
        entry[0] -= 1
        if entry[0] == 0:
            del self._groups[t.group]

    def _nobody_may(self, item: Any) -> bool:
        """Whether no waiter in line may take ``item``, told by their groups alone."""
        return not self._alone and not any(accepts.group_may(item) for _, accepts in self._groups.values())

    def _wake(self, budget: int, work: int, item: Any = None) -> bool:
        """Wake the first waiter in line that has not seen notify ``work``'s work and may take
        ``item`` (None: any work)."""
        if item is not None and self._nobody_may(item):
            return False
        line = self._line
        i = 0
        while i < len(line):
            t = line[i]
            if t.done:
                if i == 0:  # finished ones at the front leave the line as they are reached
                    line.popleft()
                    t.queued = False
                    self._dead -= 1
                else:
                    i += 1
                continue
            if t.seen >= work:
                return False  # it read after that work came, and so did every waiter behind it
            if item is not None and t.accepts is not None and not t.accepts(item):
                i += 1  # it may not take this work: it keeps its place for other work
                continue
            if i == 0:
                line.popleft()
            else:
                del line[i]
            t.queued = False
            self._leave(t)
            t.wake = budget
            t.wake_for = work
            t.wake_item = item
            t.event.set()
            return True
        return False

    def notify(self, count: int = 1, *, item: Any = None) -> None:
        """``count`` new tasks (``item``: what they are, when told): wake that many waiters,
        here and on every other replica (told what the work is too)."""
        self.wake(count, item=item)
        if self._relay is not None and count > 0:
            self._relay(count, item)

    def notify_all(self) -> None:
        self.wake_all()
        if self._relay is not None:
            self._relay(None, None)

    def wake(self, count: int = 1, *, item: Any = None) -> None:
        """Wake ``count`` waiters of this process only."""
        self._notified += 1
        budget = len(self)
        for _ in range(max(0, count)):
            if not self._wake(budget, self._notified, item):
                return

    def wake_all(self) -> None:
        """Wake every waiter of this process only."""
        self._notified += 1
        while self._wake(0, self._notified):
            pass

    def pass_on(self, budget: int, work: int | None = None, item: Any = None) -> None:
        """A woken waiter found nothing to take: wake the next one that has not seen the work
        of notify ``work`` (the wake's ``wake_for``; None: the latest) and may take ``item``
        (its ``wake_item``), while the budget lasts."""
        if budget > 0:
            self._wake(budget - 1, self._notified if work is None else work, item)

    def finish(self, ticket: Ticket) -> int | None:
        """The waiter is done with ``ticket``: it leaves the line. Returns the wake it carries
        (None when it was not woken), which the caller passes on if it takes nothing."""
        if ticket.done:
            return ticket.wake
        ticket.done = True
        self._aside.discard(ticket)
        if ticket.queued:
            self._leave(ticket)
            self._dead += 1
            if self._dead > _SWEEP_AT and 2 * self._dead > len(self._line):
                self._line = deque(t for t in self._line if not t.done)
                self._dead = 0
        return ticket.wake

    def close(self) -> None:
        """Wake everyone for good (shutdown); later tickets are woken at once."""
        self.closed = True
        self.wake_all()
        for t in self._aside:
            t.wake = 0
            t.event.set()
        self._aside.clear()

    def __len__(self) -> int:
        return len(self._line) - self._dead


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

    def wake_all(self) -> None:
        """Wake every waiter of this process only (whatever its key)."""
        events, self._events = self._events, {}
        for event, _ in events.values():
            event.set()

    def close(self) -> None:
        self.closed = True
        for event, _ in self._events.values():
            event.set()
        self._events.clear()

    def __len__(self) -> int:
        return len(self._events)


#: A hold is cut short by at most this part of it to end on a tick.
_MOST_EARLY = 1 / 20


def hold_deadline(start: float, wait: float, *, tick: float) -> float:
    """When a long-poll begun at ``start`` (the loop's clock) and held ``wait`` seconds ends:
    the last multiple of ``tick`` not after ``start + wait``, or ``start + wait`` itself when
    ``tick`` is 0 or more than a twentieth of ``wait``.

    Idle holds that run out end together, a tick's worth at a time, instead of one at a time:
    the daemons answered at one tick poll again at once and stay on it. A thousand daemons'
    re-polls are then handled in a few bursts a second rather than spread out, each one on a
    process that has just run the same code, which costs far less CPU than one every few
    milliseconds on a process that has gone idle (the kernel's timer slack does the same for
    timers). A hold never lasts longer than asked, so a client's own timeout is never reached.
    """
    end = start + wait
    if tick <= 0 or tick > wait * _MOST_EARLY:
        return end
    return math.floor(end / tick) * tick


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
