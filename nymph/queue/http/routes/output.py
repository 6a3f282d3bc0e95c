"""Output routes: an instance's log for users (JSON, raw text, followed live) and the log chunks
daemons ship.

``GET .../instances/{id}/logs`` answers ``{instanceId, logs}`` as it always did (the stored log,
or the tail an older daemon uploaded before reaping); ``?since=OFFSET`` starts at a byte offset
of the log as the job printed it. With ``?follow=true`` or ``Accept: text/plain`` the answer is
the raw log, chunked, held open until the log is over (see :func:`nymph.queue.output.follow_over`);
``?follow=false`` with ``Accept: text/plain`` gives the raw log as stored so far. Headers carry
the offsets: ``X-Nymph-Log-Offset`` (where the answer starts), ``X-Nymph-Log-Next-Offset`` (where
it ends, JSON and plain only), ``X-Nymph-Log-Dropped`` (``START-END``, the dropped range) and
``X-Nymph-Log-Complete``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
from typing import Any

from aiohttp import web

from nymph.protocol import now
from nymph.queue.errors import NotInstanceDaemon, ServiceError, Unprocessable
from nymph.queue.http.answers import json_response
from nymph.queue.http.bodies import Fields, query_flag, query_int, read_object
from nymph.queue.http.caller import daemon_session
from nymph.queue.http.keys import STORE
from nymph.queue.http.routes.refusals import log_refusal, logged_refusal
from nymph.queue.output import follow_over
from nymph.queue.sql.logchunks import DaemonChunk, LogStatus

routes = web.RouteTableDef()
NS = "/v1/namespaces/{ns}"
#: A held follow looks at its client and the instance at least this often.
_FOLLOW_TICK = 2.0
_MAX_OFFSET = 2**62
_MAX_CHUNK = 512 * 1024


def _wants_text(request: web.Request) -> bool:
    accept = request.headers.get("Accept", "")
    return "text/plain" in accept and "application/json" not in accept


def _headers(*, since: int, st: LogStatus | None, next_offset: int | None) -> dict[str, str]:
    st = st or LogStatus()
    out = {
        "X-Nymph-Log-Offset": str(since),
        "X-Nymph-Log-Dropped": f"{st.dropped.start}-{st.dropped.end}",
        "X-Nymph-Log-Complete": "true" if st.complete else "false",
    }
    if next_offset is not None:
        out["X-Nymph-Log-Next-Offset"] = str(next_offset)
    return out


@routes.get(NS + "/providers/{name}/instances/{id}/logs")
async def get_logs(request: web.Request) -> web.StreamResponse:
    m = request.match_info
    since = query_int(request, "since", minimum=0, maximum=_MAX_OFFSET) or 0
    follow = query_flag(request, "follow")
    text = _wants_text(request)
    if follow or (follow is None and text):
        return await _follow(request, since=since)
    output = request.app[STORE].output
    stored, tail = await output.read_all(ns=m["ns"], provider=m["name"], instance_id=m["id"], since=since)
    if stored is not None and (stored.status.total > 0 or tail is None):
        data, st, next_offset = stored.data, stored.status, stored.next_offset
    elif tail is not None:
        raw = tail.encode("utf-8")
        data, st, next_offset = raw[since:], None, max(since, len(raw))
    else:
        data, st, next_offset = None, None, since
    headers = _headers(since=since, st=st, next_offset=next_offset)
    if text:
        return web.Response(body=data or b"", content_type="text/plain", charset="utf-8", headers=headers)
    logs = None if data is None else data.decode("utf-8", errors="replace")
    return json_response({"instanceId": m["id"], "logs": logs}, headers=headers)


async def _follow(request: web.Request, *, since: int) -> web.StreamResponse:
    """The raw log from ``since``, written as it arrives until the log is over."""
    m = request.match_info
    store = request.app[STORE]
    output = store.output
    grace = output.settings.follow_grace_seconds
    iid = m["id"]
    first = await output.follow_read(ns=m["ns"], provider=m["name"], instance_id=iid, since=since)
    resp = web.StreamResponse(headers=_headers(since=since, st=first.read.status, next_offset=None))
    resp.content_type = "text/plain"
    resp.charset = "utf-8"
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    pos = since
    while True:
        event = output.appended.current(iid)
        changed = store.instance_changed.current(iid)
        try:
            # Read after taking the events: a chunk landing in between has set one of them.
            current = await output.follow_read(ns=m["ns"], provider=m["name"], instance_id=iid, since=pos)
            if current.read.data:
                try:
                    await resp.write(current.read.data)
                except ConnectionError:
                    return resp  # the reader went away
            pos = current.read.next_offset
            if follow_over(current, at=now(), grace=grace):
                break
            if not current.read.data:
                transport = request.transport
                if output.appended.closed or transport is None or transport.is_closing():
                    break
                await _either(event, changed, timeout=_FOLLOW_TICK)
        finally:
            output.appended.release(iid, event)
            store.instance_changed.release(iid, changed)
    with contextlib.suppress(ConnectionError):
        await resp.write_eof()
    return resp


async def _either(a: asyncio.Event, b: asyncio.Event, *, timeout: float) -> None:
    waits = [asyncio.ensure_future(a.wait()), asyncio.ensure_future(b.wait())]
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


# --- daemons ---------------------------------------------------------------------------------


_CHUNK_FIELDS = {"instanceId", "offset", "data", "cursor", "final", "note"}
#: Chunks in one ``POST /v1/dispatch/logchunks/batch`` at most (the body's cap bounds the bytes).
_MAX_BATCH = 500


def _chunk(f: Fields) -> DaemonChunk:
    """One chunk of a body (``f``: the body, or one item of a batch), checked."""
    instance_id = f.req_string("instanceId")
    offset = f.integer("offset", minimum=0, maximum=_MAX_OFFSET)
    encoded = f.text("data", required=False) or ""
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise Unprocessable(f"{f.where}.data must be base64") from None
    if len(data) > _MAX_CHUNK:
        raise Unprocessable(f"{f.where}.data holds more than {_MAX_CHUNK} bytes: ship smaller chunks")
    return DaemonChunk(
        instance_id=instance_id,
        offset=offset,
        data=data,
        cursor=f.string("cursor", required=False, max_len=1024),
        final=f.boolean("final", default=False),
        note=f.string("note", required=False, max_len=2000),
    )


def _answer(st: LogStatus, instance_id: str) -> dict[str, Any]:
    return {"instanceId": instance_id, "size": st.total, "complete": st.complete}


@routes.post("/v1/dispatch/logchunks")
async def log_chunk(request: web.Request) -> web.Response:
    f = Fields(await read_object(request))
    f.reject_unknown({"daemonId", *_CHUNK_FIELDS})
    session = daemon_session(request, f, refuse_empty=False)
    chunk = _chunk(f)
    with logged_refusal(session=session, route="logchunks"):
        st = await request.app[STORE].output.daemon_append(
            session=session,
            instance_id=chunk.instance_id,
            offset=chunk.offset,
            data=chunk.data,
            cursor=chunk.cursor,
            final=chunk.final,
            note=chunk.note,
        )
    return json_response(_answer(st, chunk.instance_id))


@routes.post("/v1/dispatch/logchunks/batch")
async def log_chunk_batch(request: web.Request) -> web.Response:
    """Many chunks in one request and one transaction, each answered (``httpStatus`` and
    ``body``) as :func:`log_chunk` would answer it alone."""
    f = Fields(await read_object(request))
    f.reject_unknown({"daemonId", "chunks"})
    session = daemon_session(request, f, refuse_empty=False)
    raws = f.objects("chunks", max_items=_MAX_BATCH)
    parsed: list[DaemonChunk | ServiceError] = []
    for i, raw in enumerate(raws):
        item = Fields(raw, where=f"body.chunks[{i}]")
        try:
            item.reject_unknown(_CHUNK_FIELDS)
            parsed.append(_chunk(item))
        except ServiceError as exc:
            parsed.append(exc)
    chunks = [p for p in parsed if isinstance(p, DaemonChunk)]
    stored = iter(
        await request.app[STORE].output.daemon_append_many(session=session, chunks=chunks) if chunks else []
    )
    answers = []
    for raw, p in zip(raws, parsed, strict=True):
        outcome = next(stored) if isinstance(p, DaemonChunk) else p
        instance_id = raw.get("instanceId") if isinstance(raw.get("instanceId"), str) else None
        if isinstance(outcome, NotInstanceDaemon):
            log_refusal(outcome, session=session, route="logchunks/batch")
        if isinstance(outcome, ServiceError):
            error = {"error": outcome.code, "detail": outcome.detail}
            answers.append({"instanceId": instance_id, "httpStatus": outcome.status, "body": error})
        else:
            assert instance_id is not None
            answers.append(
                {"instanceId": instance_id, "httpStatus": 200, "body": _answer(outcome, instance_id)}
            )
    return json_response({"answers": answers})
