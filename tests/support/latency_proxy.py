"""A TCP proxy on loopback that delays every byte by a fixed time each way: a database one
network round trip away (as in any cloud), in front of the tests' PostgreSQL server.

Each side of each connection is a protocol that sets a timer per chunk it reads, to write it
to the other side ``delay`` later (each due after the one before, so the order is kept): a
chunk waits ``delay`` and no more, whatever is in flight behind it (the delay does not add up
over a busy connection, as it would with a sleep per chunk in one loop). A chunk costs one
timer and no task switch, so the proxy takes little of the CPU that the processes it stands
between share with it.

:class:`LatencyProxy` runs in the caller's event loop; :func:`running_proxy` runs one in a
thread of its own (so the code under test and the proxy do not share a loop); ``python -m
tests.support.latency_proxy --target-unix PATH`` runs one as a process of its own (the
benchmarks, so the proxy's CPU is not the load generator's) and prints ``listening on PORT``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

#: The delay each way that stands for a database in another machine of the same zone.
DELAY = 0.001


@dataclass
class LatencyProxy:
    """Listens on 127.0.0.1 (a free port), forwards to a unix socket ``target_unix`` or a TCP
    ``target_host``/``target_port``, ``delay`` seconds each way."""

    target_unix: str | None = None
    target_host: str = "127.0.0.1"
    target_port: int = 0
    delay: float = DELAY
    port: int = 0
    #: Round trips so far, over all connections: the times a client sent something after it
    #: had last received (or first), however its bytes were split into chunks.
    round_trips: int = 0
    #: Round trips under way now (sent, not answered yet), and the most seen at once.
    in_flight: int = 0
    most_in_flight: int = 0
    _server: asyncio.Server | None = None
    #: Connections to the target under way (a client's bytes wait until it is made).
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _sides: set[_Side] = field(default_factory=set)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Side(self, client=True), host="127.0.0.1", port=0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    def cut(self) -> None:
        """Close every connection under way (as a network that drops them would); new ones are
        still taken."""
        for side in list(self._sides):
            side.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.cut()
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def _accepted(self, side: _Side) -> None:
        """A client connected: connect to the target, then let its bytes through."""
        task = asyncio.get_running_loop().create_task(self._connect(side), name="latency-proxy-connect")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _connect(self, client: _Side) -> None:
        loop = asyncio.get_running_loop()
        upstream = _Side(self, client=False)
        upstream.peer, upstream.conn = client, client.conn  # the target may speak first
        try:
            if self.target_unix is not None:
                await loop.create_unix_connection(lambda: upstream, self.target_unix)
            else:
                await loop.create_connection(lambda: upstream, self.target_host, self.target_port)
        except OSError:
            client.close()
            return
        if client.transport is None or client.transport.is_closing():
            upstream.close()
            return
        client.link(upstream)

    # -- round trips, told of what each side sends ----------------------------------------------

    def _sent(self, conn: _Conn, *, by_client: bool, end: bool = False) -> None:
        if by_client:
            if end:  # the client left (its last message is answered by no one)
                if conn.talking:
                    self.in_flight -= 1
                conn.talking = False
            elif not conn.talking:
                self.round_trips += 1
                self.in_flight += 1
                self.most_in_flight = max(self.most_in_flight, self.in_flight)
                conn.talking = True
        elif not end:
            if conn.talking:
                self.in_flight -= 1
            conn.talking = False


@dataclass
class _Conn:
    talking: bool = False  # the client sent last, on this connection


class _Side(asyncio.Protocol):
    """One socket of a proxied connection: what it reads is written to its peer ``delay``
    later (a timer per chunk, each due strictly after the one before: the order is kept); its
    end (or loss) closes the peer once everything read before it is delivered."""

    def __init__(self, proxy: LatencyProxy, *, client: bool) -> None:
        self.proxy = proxy
        self.client = client
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self.conn = _Conn()
        self.last = 0.0  # when the last chunk read here is due at the peer
        self.ended = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.proxy._sides.add(self)
        if self.client:
            transport.pause_reading()  # until the target is connected
            self.proxy._accepted(self)

    def link(self, peer: _Side) -> None:
        self.peer = peer
        if self.transport is not None:
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self.peer is None:
            return
        self.proxy._sent(self.conn, by_client=self.client)
        loop = asyncio.get_running_loop()
        self.last = max(loop.time() + self.proxy.delay, self.last + 1e-6)
        loop.call_at(self.last, self.peer.write, data)

    def eof_received(self) -> bool:
        self._end()
        return True  # the peer's close closes this one

    def connection_lost(self, exc: Exception | None) -> None:
        self.proxy._sides.discard(self)
        self._end()

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _end(self) -> None:
        if self.ended:
            return
        self.ended = True
        self.proxy._sent(self.conn, by_client=self.client, end=True)
        if self.peer is None:
            return
        loop = asyncio.get_running_loop()
        loop.call_at(max(loop.time() + self.proxy.delay, self.last + 1e-6), self.peer.close)


@contextlib.contextmanager
def running_proxy(*, target_unix: str, delay: float = DELAY) -> Iterator[LatencyProxy]:
    """A proxy in a thread with its own event loop, stopped (and its thread joined) at the end."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="latency-proxy", daemon=True)
    thread.start()
    proxy = LatencyProxy(target_unix=target_unix, delay=delay)
    try:
        asyncio.run_coroutine_threadsafe(proxy.start(), loop).result(10)
        yield proxy
    finally:
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(proxy.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def pg_url_through(url: str, port: int) -> str:
    """The URL of the same database as ``url`` (a unix-socket URL of the tests' server), through
    a proxy on 127.0.0.1:``port``."""
    dbname = url.split("/", 3)[3].split("?", 1)[0]
    return f"postgresql://postgres@127.0.0.1:{port}/{dbname}"


async def _serve(args: argparse.Namespace) -> None:
    proxy = LatencyProxy(target_unix=args.target_unix, delay=args.delay_ms / 1000)
    await proxy.start()
    print(f"listening on {proxy.port}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await proxy.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="a TCP proxy on loopback that adds a delay each way")
    parser.add_argument("--target-unix", required=True, help="the unix socket to forward to")
    parser.add_argument("--delay-ms", type=float, default=DELAY * 1000, help="delay each way (ms)")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
