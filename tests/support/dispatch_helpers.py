"""Acting as the daemon of an instance in queue tests: a daemon writes an instance (reports, log
chunks, log tails, result files) only while it holds the lease of one of its tasks or as the
daemon that applied it (see nymph.queue.sql.binding), so tests claim, and complete, first."""

from __future__ import annotations

from collections.abc import Sequence

from nymph.client import QueueClient
from nymph.protocol import TaskJSON


async def take(
    d: QueueClient, *, daemon_id: str = "d1", node: str = "n1", count: int = 1, namespaces: Sequence[str] = ()
) -> list[str]:
    """Claim the next ``count`` tasks as ``daemon_id`` on ``node`` and keep their leases; returns
    their instance ids."""
    tasks = await _claim(d, daemon_id=daemon_id, node=node, count=count, namespaces=namespaces)
    return [str(t["instanceId"]) for t in tasks]


async def apply(
    d: QueueClient, *, daemon_id: str = "d1", node: str = "n1", count: int = 1, namespaces: Sequence[str] = ()
) -> list[str]:
    """Claim the next ``count`` tasks as ``daemon_id`` on ``node`` and complete them (the daemon
    applied their Pods); returns their instance ids."""
    tasks = await _claim(d, daemon_id=daemon_id, node=node, count=count, namespaces=namespaces)
    for t in tasks:
        await d.complete(daemon_id=daemon_id, task_id=t["taskId"], ok=True)
    return [str(t["instanceId"]) for t in tasks]


async def _claim(
    d: QueueClient, *, daemon_id: str, node: str, count: int, namespaces: Sequence[str]
) -> list[TaskJSON]:
    tasks = await d.claim(daemon_id=daemon_id, node=node, namespaces=namespaces, capacity=count, wait=0)
    assert len(tasks) == count, f"claimed {len(tasks)} of {count} tasks"
    return tasks
