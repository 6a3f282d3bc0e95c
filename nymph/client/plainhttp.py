"""One HTTP exchange with the standard library, for a command that makes a few calls and exits.

``aiohttp`` takes longer to import than a whole CLI call to a local queue takes to run, so the
CLI's plain calls (:meth:`nymph.client.transport.Transport.request` with ``light=True``) go
through :mod:`http.client` instead; following a log and downloading files keep ``aiohttp``.

The blocking exchange runs on a daemon thread and is awaited as a future, so Ctrl-C or a
cancelled call returns at once (a thread parked in a long-poll never holds up the exit).
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json as jsonlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit


class Unreachable(Exception):
    """Nothing answered at the address (refused, no such host, the connect timed out)."""


class Lost(Exception):
    """The connection broke before the whole answer arrived."""


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes


def _connection(url: str, *, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    parts = urlsplit(url)
    host = parts.hostname or "localhost"
    if parts.scheme == "https":
        import ssl  # only an https queue pays for it

        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            host, parts.port, timeout=timeout, context=ssl.create_default_context()
        )
    else:
        conn = http.client.HTTPConnection(host, parts.port, timeout=timeout)
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    return conn, target


def exchange(
    method: str,
    url: str,
    *,
    json: Any = None,
    params: Mapping[str, str] | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float,
    connect_timeout: float,
) -> Answer:
    """One request and its whole answer (blocking). ``timeout`` bounds each wait for data once
    connected, ``connect_timeout`` the connect; :class:`Unreachable` / :class:`Lost` on failure."""
    if params:
        url += ("&" if "?" in url else "?") + urlencode(dict(params))
    conn, target = _connection(url, timeout=connect_timeout)
    hdrs = {"Accept": "application/json", **dict(headers or {})}
    body: bytes | None = None
    if json is not None:
        body = jsonlib.dumps(json).encode()
        hdrs["Content-Type"] = "application/json"
    try:
        try:
            conn.connect()
        except OSError as exc:  # TimeoutError (the connect timed out) included
            raise Unreachable(str(exc.__class__.__name__)) from None
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        try:
            conn.request(method, target, body=body, headers=hdrs)
            resp = conn.getresponse()
            raw = resp.read()
        except TimeoutError:
            raise
        except (OSError, http.client.HTTPException) as exc:
            raise Lost(exc.__class__.__name__) from None
        return Answer(resp.status, raw)
    finally:
        conn.close()


def _hand_over(
    loop: asyncio.AbstractEventLoop, settle: Any, answer: Answer | None, error: BaseException | None
) -> None:
    # a closed loop (the command ended) means nobody waits for this answer
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(settle, answer, error)


async def detached(call: Callable[[], Answer]) -> Answer:
    """``call`` (an :func:`exchange`) on a daemon thread, awaited: cancelling the await abandons
    the thread (its socket closes when the process exits or the answer comes)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Answer] = loop.create_future()

    def settle(result: Answer | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            assert result is not None
            future.set_result(result)

    def work() -> None:
        try:
            answer = call()
        except BaseException as exc:  # handed to the awaiting task, never lost on the thread
            _hand_over(loop, settle, None, exc)
            return
        _hand_over(loop, settle, answer, None)

    threading.Thread(target=work, name="nymph-cli-http", daemon=True).start()
    return await future
