"""Following an instance's log through the queue (for the CLI): the raw stream, resumed where
it broke.

:func:`follow_log` reads ``GET .../logs?follow=true&since=N`` and hands the bytes to ``write``
as they arrive; when the connection drops (a queue restart) it asks again from the offset it
reached (see :func:`nymph.launch.logcap.resume_offset`), with backoff, a bounded number of
times in a row. It returns when the queue ends the stream: the log is over.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from nymph.client.errors import QueueUnavailable
from nymph.client.user import UserClient
from nymph.launch.logcap import Dropped, resume_offset


def _dropped(header: str | None) -> Dropped:
    start, _, end = (header or "").partition("-")
    try:
        return Dropped(int(start), int(end))
    except ValueError:
        return Dropped()


async def follow_log(
    client: UserClient,
    *,
    provider: str,
    instance_id: str,
    write: Callable[[bytes], None],
    since: int = 0,
    retries: int = 30,
    backoff: float = 0.5,
) -> int:
    """Write the log from ``since`` as it arrives until it is over; returns the offset reached.
    Raises :class:`QueueUnavailable` after ``retries`` failed connections in a row."""
    path = client.logs_path(provider=provider, instance_id=instance_id)
    offset = since
    failures = 0
    while True:
        received = 0
        dropped = Dropped()
        try:
            async with client.stream(path, params={"follow": "true", "since": str(offset)}) as resp:
                dropped = _dropped(resp.headers.get("X-Nymph-Log-Dropped"))
                failures = 0
                async for data in resp.content.iter_any():
                    received += len(data)
                    write(data)
            return resume_offset(since=offset, received=received, dropped=dropped)
        except QueueUnavailable:
            if received:
                offset = resume_offset(since=offset, received=received, dropped=dropped)
            failures += 1
            if failures > retries:
                raise
            await asyncio.sleep(min(backoff * 2 ** min(failures, 5), 5.0))
