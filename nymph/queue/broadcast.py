"""What replicas tell each other through the database's broadcast channel, and whom each
message wakes here: a key names what changed (a bare instance id, new tasks with their count,
a namespace's new events, an instance's appended log); an empty key means "everything" (a
listener that reconnected may have missed broadcasts)."""

from __future__ import annotations

from nymph.queue.notify import KeyedSignal, WorkSignal
from nymph.queue.output import LOG_KEY
from nymph.queue.wakeup import LaunchWork

#: Broadcast key prefix (besides a bare instance id, and ``output.LOG_KEY``): new tasks, with
#: their count, or none for "wake every claim". A count may be followed by :data:`ITEM_SEP` and
#: what the work is (:meth:`LaunchWork.wire`): it then wakes only claims that may take it.
TASKS_KEY = "tasks:"
ITEM_SEP = "@"
#: Broadcast key prefix: new events in the namespace that follows it.
EVENTS_KEY = "events:"


def work_key(count: int | None, item: object = None) -> str:
    """The key of ``count`` new tasks (None: wake every claim); ``item``, a launch's wake-up,
    travels with its count when it has a wire form."""
    if count is None:
        return TASKS_KEY
    wire = item.wire() if isinstance(item, LaunchWork) else None
    return f"{TASKS_KEY}{count}" if wire is None else f"{TASKS_KEY}{count}{ITEM_SEP}{wire}"


def coalesce(keys: list[str]) -> list[str]:
    """The keys told while a broadcast was under way, as few that wake the same waiters: the
    task counts added up, those of each kind of work apart (or "every claim" if one was), each
    other key once, in first order."""
    out: dict[str, None] = {}
    count: int | None = 0
    items: dict[str, int] = {}
    for key in keys:
        if not key.startswith(TASKS_KEY):
            out[key] = None
            continue
        if count is None:
            continue
        n, sep, wire = key.removeprefix(TASKS_KEY).partition(ITEM_SEP)
        if not (n.isascii() and n.isdigit()):
            count = None
        elif sep:
            items[wire] = items.get(wire, 0) + int(n)
        else:
            count += int(n)
    if "" in out:
        return [""]
    if count is None:
        return [TASKS_KEY, *out]
    tasks = [work_key(count)] if count else []
    tasks += [f"{TASKS_KEY}{n}{ITEM_SEP}{wire}" for wire, n in items.items()]
    return [*tasks, *out]


def wake_for(
    key: str, *, tasks: WorkSignal, instances: KeyedSignal, events: KeyedSignal, appended: KeyedSignal
) -> None:
    """Wake this replica's long-polls that another replica's ``key`` concerns."""
    if not key:
        tasks.wake_all()
        instances.wake_all()
        events.wake_all()
        appended.wake_all()
    elif key.startswith(EVENTS_KEY):
        events.wake(key.removeprefix(EVENTS_KEY))
    elif key.startswith(TASKS_KEY):
        count, sep, wire = key.removeprefix(TASKS_KEY).partition(ITEM_SEP)
        if count.isascii() and count.isdigit():
            tasks.wake(int(count), item=LaunchWork.from_wire(wire) if sep else None)
        else:
            tasks.wake_all()
    elif key.startswith(LOG_KEY):
        appended.wake(key.removeprefix(LOG_KEY))
    else:
        instances.wake(key)
