"""What replicas tell each other through the database's broadcast channel, and whom each
message wakes here: a key names what changed (a bare instance id, new tasks with their count,
a namespace's new events, an instance's appended log); an empty key means "everything" (a
listener that reconnected may have missed broadcasts)."""

from __future__ import annotations

from nymph.queue.notify import KeyedSignal, WorkSignal
from nymph.queue.output import LOG_KEY

#: Broadcast key prefix (besides a bare instance id, and ``output.LOG_KEY``): new tasks, with
#: their count, or none for "wake every claim".
TASKS_KEY = "tasks:"
#: Broadcast key prefix: new events in the namespace that follows it.
EVENTS_KEY = "events:"


def work_key(count: int | None) -> str:
    return TASKS_KEY if count is None else f"{TASKS_KEY}{count}"


def coalesce(keys: list[str]) -> list[str]:
    """The keys told while a broadcast was under way, as few that wake the same waiters: the
    task counts added up (or "every claim" if one was), each other key once, in first order."""
    out: dict[str, None] = {}
    count: int | None = 0
    for key in keys:
        if key.startswith(TASKS_KEY) and count is not None:
            n = key.removeprefix(TASKS_KEY)
            count = count + int(n) if n.isdigit() else None
        elif not key.startswith(TASKS_KEY):
            out[key] = None
    tasks = [work_key(count)] if count != 0 else []
    return [*tasks, *out] if "" not in out else [""]


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
        count = key.removeprefix(TASKS_KEY)
        if count.isdigit():
            tasks.wake(int(count))
        else:
            tasks.wake_all()
    elif key.startswith(LOG_KEY):
        appended.wake(key.removeprefix(LOG_KEY))
    else:
        instances.wake(key)
