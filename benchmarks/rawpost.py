"""A lean load generator: JSON POSTs over kept-alive HTTP/1.1 connections, each request a few
bytes written and an answer read by its ``Content-Length``, nothing more.

On a machine of two cores the load shares the cores with what it measures. nymph's own client
(:class:`nymph.client.QueueClient`: aiohttp, retries, error mapping) spent about 170 us of CPU
per launch POST in bursts of 16 on the bench's machine, this about 60 us, so more of what a
benchmark times is the queue, not its load. It speaks only what
the queue answers (a ``Content-Length`` body, no chunking) and refuses anything else."""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit


class RawPostError(RuntimeError):
    """An answer this generator cannot read, or a connection lost before its answer."""


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
        length = None
        for line in head[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        if length is None:
            waiter.set_exception(RawPostError(f"an answer without Content-Length: {head[0]!r}"))
            return
        if len(self.buffer) < end + 4 + length:
            return
        body = bytes(self.buffer[end + 4 : end + 4 + length])
        del self.buffer[: end + 4 + length]
        waiter.set_result((int(head[0].split(" ", 2)[1]), body))

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(RawPostError(f"connection lost before the answer ({exc})"))


class RawPoster:
    """POSTs JSON to ``base_url`` with a bearer ``token``; as many connections as requests at
    once, each kept for the next request."""

    def __init__(self, base_url: str, token: str) -> None:
        url = urlsplit(base_url)
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 80
        self.prefix = url.path.rstrip("/")
        self._head = (
            f"Host: {url.netloc}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        )
        self._idle: list[_Connection] = []
        self._all: list[_Connection] = []

    async def post(self, path: str, body: Any) -> tuple[int, Any]:
        """``(status, decoded JSON answer)``."""
        data = json.dumps(body).encode()
        request = (
            f"POST {self.prefix}{path} HTTP/1.1\r\n{self._head}Content-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        conn = self._idle.pop() if self._idle else await self._open()
        assert conn.transport is not None
        conn.waiter = asyncio.get_running_loop().create_future()
        conn.transport.write(request)
        status, answer = await conn.waiter
        conn.waiter = None
        if conn.transport is not None:
            self._idle.append(conn)
        return status, json.loads(answer)

    async def _open(self) -> _Connection:
        _, conn = await asyncio.get_running_loop().create_connection(_Connection, self.host, self.port)
        self._all.append(conn)
        return conn

    def close(self) -> None:
        for conn in self._all:
            if conn.transport is not None:
                conn.transport.close()
        self._all.clear()
        self._idle.clear()
