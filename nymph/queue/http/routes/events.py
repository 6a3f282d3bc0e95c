"""The namespace event stream: ``GET /v1/namespaces/{ns}/events``.

Without ``follow`` the answer is a page, ``{"items": [...], "continue": CURSOR}``, oldest first,
after ``?after=CURSOR`` (an event's ``cursor`` or a ``continue`` value; from the oldest kept
event without it), at most ``?limit=N``; ``continue`` is always given and reading on from it
never repeats or skips an event. Filters: ``provider``, ``group``, ``instance``.

``?follow=true`` keeps the connection and writes each event as it is committed: one JSON object
per line (``application/x-ndjson``; an empty line now and then keeps the connection alive), or,
with ``Accept: text/event-stream``, Server-Sent Events whose ``id`` is the cursor, so that a
browser's ``EventSource`` resumes after a reconnect by itself (``Last-Event-ID`` wins over
``after``). An event stream is always followed. A follower waits on the namespace's signal
(:class:`nymph.queue.events.EventFeed`), never on a timer. A cursor older than the kept events
is a 410 (``cursor_expired``), before the stream starts or as the stream's last record.
"""

from __future__ import annotations

import json

from aiohttp import web

from nymph.queue.errors import BadRequest, Gone
from nymph.queue.http.answers import json_response
from nymph.queue.http.bodies import query_flag
from nymph.queue.http.keys import STORE
from nymph.queue.http.middlewares import error_body
from nymph.queue.notify import KeyedSignal, wait_for_event
from nymph.queue.paging import parse_limit
from nymph.queue.sql.events import EventFilter, EventPage, parse_cursor

routes = web.RouteTableDef()
NS = "/v1/namespaces/{ns}"
#: A quiet stream writes a keep-alive this often (seconds).
KEEPALIVE = 15.0
#: How long a browser waits before it reconnects an event stream (milliseconds).
SSE_RETRY_MS = 2000


def _filter(request: web.Request) -> EventFilter:
    values = {}
    for key in ("provider", "group", "instance"):
        raw = request.query.get(key) or None
        if raw is not None and (len(raw) > 253 or not raw.isprintable()):
            raise BadRequest(f"query parameter {key} is not a name", code="invalid_query")
        values[key] = raw
    return EventFilter(**values)


def _after(request: web.Request, *, sse: bool) -> int | None:
    last = request.headers.get("Last-Event-ID") if sse else None
    if last:
        return parse_cursor(last.strip(), name="Last-Event-ID")
    after = request.query.get("after") or None
    cont = request.query.get("continue") or None
    if after is not None and cont is not None and after != cont:
        raise BadRequest("give after or continue, not both", code="invalid_query")
    return parse_cursor(after or cont)


@routes.get(NS + "/events")
async def list_events(request: web.Request) -> web.StreamResponse:
    ns = request.match_info["ns"]
    sse = "text/event-stream" in request.headers.get("Accept", "")
    follow = query_flag(request, "follow")
    where = _filter(request)
    limit = parse_limit(request.query.get("limit"))
    after = _after(request, sse=sse)
    feed = request.app[STORE].events
    if not (follow or sse):
        page = await feed.page(ns=ns, after=after, limit=limit, where=where)
        return json_response({"items": page.items, "continue": str(page.next_cursor)})
    waiter = _Waiter(feed.added, ns)
    try:
        first = await feed.page(ns=ns, after=after, limit=limit, where=where)  # a 410 is still an answer
        resp = web.StreamResponse(headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        resp.content_type = "text/event-stream" if sse else "application/x-ndjson"
        resp.charset = "utf-8"
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        try:
            if sse:
                await resp.write(f"retry: {SSE_RETRY_MS}\n\n".encode())
            await _follow(request, resp, first=first, waiter=waiter, sse=sse, where=where, limit=limit)
            await resp.write_eof()
        except ConnectionError:
            pass  # the reader went away
        return resp
    finally:
        waiter.done()


class _Waiter:
    """The follower's hold on its namespace's signal: taken before each read, waited on after."""

    def __init__(self, signal: KeyedSignal, key: str) -> None:
        self.signal, self.key = signal, key
        self.event = signal.current(key)

    def renew(self) -> None:
        self.signal.release(self.key, self.event)
        self.event = self.signal.current(self.key)

    def done(self) -> None:
        self.signal.release(self.key, self.event)


def _frame(item: object, *, cursor: str | None, sse: bool) -> str:
    text = json.dumps(item, separators=(",", ":"))
    if not sse:
        return text + "\n"
    return f"id: {cursor}\ndata: {text}\n\n" if cursor is not None else f"event: error\ndata: {text}\n\n"


async def _follow(
    request: web.Request,
    resp: web.StreamResponse,
    *,
    first: EventPage,
    waiter: _Waiter,
    sse: bool,
    where: EventFilter,
    limit: int,
) -> None:
    """Write ``first``, then every later page as its events are committed, until the queue shuts
    down or the reader goes away."""
    ns = request.match_info["ns"]
    feed = request.app[STORE].events
    page, sent = first, ""
    while True:
        if page.items:
            await resp.write("".join(_frame(i, cursor=i["cursor"], sse=sse) for i in page.items).encode())
            sent = page.items[-1]["cursor"]
        cursor = str(page.next_cursor)
        if not page.full:
            transport = request.transport
            if feed.added.closed or transport is None or transport.is_closing():
                return
            if not await wait_for_event(waiter.event, KEEPALIVE):
                # A quiet stream: a keep-alive (for EventSource, the cursor read up to, if it moved).
                if not sse:
                    await resp.write(b"\n")
                elif cursor != sent:
                    await resp.write(f"id: {cursor}\n\n".encode())
                    sent = cursor
                else:
                    await resp.write(b": keep-alive\n\n")
        waiter.renew()
        try:
            page = await feed.page(ns=ns, after=int(cursor), limit=limit, where=where)
        except Gone as exc:  # retention overtook a slow reader
            await resp.write(
                _frame(error_body(code=exc.code, detail=str(exc)), cursor=None, sse=sse).encode()
            )
            return
