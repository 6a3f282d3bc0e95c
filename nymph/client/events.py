"""A namespace's event stream through the queue (for the CLI and integrations): one page, or the
stream followed and resumed where it broke.

:func:`events_page` reads ``GET .../events?after=CURSOR``. :func:`follow_events` reads
``?follow=true`` as JSON lines and hands each event to ``on_event``; when the connection drops
(a queue restart, another replica) it asks again after the last cursor it received, so no event
is repeated or skipped, with backoff, a bounded number of failures in a row. It returns only
when the queue ends the stream (it shuts down) and ``reconnect`` is false.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from typing import Any, cast

from nymph.client.errors import QueueUnavailable
from nymph.client.user import UserClient
from nymph.protocol import EventJSON


def events_path(client: UserClient, *, namespace: str | None = None) -> str:
    return f"{client._ns(namespace)}/events"


def _query(filters: Mapping[str, str | None], after: str | None) -> dict[str, str]:
    query = {k: v for k, v in filters.items() if v}
    if after:
        query["after"] = after
    return query


async def events_page(
    client: UserClient,
    *,
    after: str | None = None,
    limit: int | None = None,
    filters: Mapping[str, str | None] | None = None,
    namespace: str | None = None,
) -> tuple[list[EventJSON], str]:
    """The events after ``after`` (the oldest kept without it) and the cursor to read on from."""
    query = _query(filters or {}, after)
    if limit is not None:
        query["limit"] = str(limit)
    body = await client.request("GET", events_path(client, namespace=namespace), params=query or None)
    return cast(list[EventJSON], body["items"]), str(body["continue"])


async def follow_events(
    client: UserClient,
    *,
    on_event: Callable[[EventJSON], None],
    after: str | None = None,
    filters: Mapping[str, str | None] | None = None,
    namespace: str | None = None,
    reconnect: bool = True,
    retries: int = 30,
    backoff: float = 0.5,
) -> str | None:
    """Hand every event after ``after`` to ``on_event`` as it is committed; returns the last
    cursor received when the stream ends. Raises :class:`QueueUnavailable` after ``retries``
    failed connections in a row."""
    path = events_path(client, namespace=namespace)
    cursor = after
    failures = 0
    while True:
        try:
            query = {**_query(filters or {}, cursor), "follow": "true"}
            async with client.stream(path, params=query) as resp:
                failures = 0
                while line := await resp.content.readline():
                    if not line.strip():
                        continue  # a keep-alive
                    item: Any = json.loads(line)
                    if "cursor" not in item:  # the stream's last record: an error
                        raise QueueUnavailable(str(item.get("detail") or item))
                    cursor = str(item["cursor"])
                    on_event(cast(EventJSON, item))
            if not reconnect:
                return cursor
        except QueueUnavailable:
            failures += 1
            if failures > retries:
                raise
        await asyncio.sleep(min(backoff * 2 ** min(failures, 5), 5.0))
