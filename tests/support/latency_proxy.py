"""A TCP proxy on loopback that delays every byte by a fixed time each way: a database one
network round trip away (as in any cloud), in front of the tests' PostgreSQL server.

Each direction of each connection is a reader that sets a timer per chunk it reads, to write
it ``delay`` later (each due after the one before, so the order is kept): a chunk waits
``delay`` and no more, whatever is in flight behind it (the delay does not add up over a busy
connection, as it would with a sleep per chunk in one loop).

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

#: The delay each way that stands for a database in another machine of the same zone.
DELAY = 0.001
_CHUNK = 1 << 16


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
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accepted, host="127.0.0.1", port=0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    def cut(self) -> None:
        """Close every connection under way (as a network that drops them would); new ones are
        still taken."""
        for w in list(self._writers):
            w.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.close()
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.target_unix is not None:
            return await asyncio.open_unix_connection(self.target_unix)
        return await asyncio.open_connection(self.target_host, self.target_port)

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _nodelay(writer)
        try:
            up_reader, up_writer = await self._connect()
        except OSError:
            writer.close()
            return
        _nodelay(up_writer)
        self._writers.update((writer, up_writer))
        talking = [False]  # the client sent last, on this connection

        def up(data: bytes) -> None:
            if not data:  # the client left (its last message is answered by no one)
                if talking[0]:
                    self.in_flight -= 1
                talking[0] = False
                return
            if not talking[0]:
                self.round_trips += 1
                self.in_flight += 1
                self.most_in_flight = max(self.most_in_flight, self.in_flight)
                talking[0] = True

        def down(data: bytes) -> None:
            if not data:
                return
            if talking[0]:
                self.in_flight -= 1
            talking[0] = False

        for src, dst, name, seen in ((reader, up_writer, "up", up), (up_reader, writer, "down", down)):
            task = asyncio.create_task(self._pipe(src, dst, seen), name=f"latency-proxy-{name}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pipe(
        self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, seen: Callable[[bytes], None]
    ) -> None:
        """Copy ``src`` to ``dst``, each chunk written ``delay`` after it was read (a timer per
        chunk, each due strictly after the one before: the order is kept); the end (or a broken
        side) closes ``dst`` once everything read before it is delivered."""
        loop = asyncio.get_running_loop()
        last = 0.0
        try:
            while True:
                data = await src.read(_CHUNK)
                last = max(loop.time() + self.delay, last + 1e-6)
                if not data:
                    seen(data)
                    break
                seen(data)
                loop.call_at(last, _deliver, dst, data)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            done = loop.create_future()
            loop.call_at(last, _settle, done)
            with contextlib.suppress(asyncio.CancelledError):
                await done
            dst.close()
            self._writers.discard(dst)


def _settle(done: asyncio.Future[None]) -> None:
    if not done.done():  # cancelled when the proxy closed before it was due
        done.set_result(None)


def _deliver(dst: asyncio.StreamWriter, data: bytes) -> None:
    if not dst.is_closing():
        dst.write(data)


def _nodelay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


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
