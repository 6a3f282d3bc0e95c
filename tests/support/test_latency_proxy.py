"""The latency proxy the PostgreSQL tests and benchmarks put in front of the database: every
byte is delayed by its delay each way (no more: the delay does not add up over a busy
connection), in order, and an end on one side reaches the other after what came before it."""

from __future__ import annotations

import asyncio
import time

from tests.support.latency_proxy import LatencyProxy


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()  # the client's end reached the server: it ends too


async def test_bytes_cross_in_order_one_delay_each_way_and_an_end_crosses_after_them() -> None:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    proxy = LatencyProxy(target_port=port, delay=0.02)
    await proxy.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        t0 = time.monotonic()
        writer.write(b"ping")
        assert await reader.readexactly(4) == b"ping"
        first = time.monotonic() - t0
        assert 0.04 <= first < 0.5  # one delay up and one down
        assert proxy.round_trips == 1
        # many chunks in flight at once: each waits one delay, not the sum of those before it
        chunks = [bytes([i]) * 1000 for i in range(50)]
        t0 = time.monotonic()
        for chunk in chunks:
            writer.write(chunk)
            await writer.drain()
            await asyncio.sleep(0.001)
        got = await reader.readexactly(sum(map(len, chunks)))
        assert got == b"".join(chunks)
        assert time.monotonic() - t0 < 0.5  # 50 chunks one after another would take 2 s
        writer.write_eof()  # the end goes after the bytes before it, and comes back
        assert await asyncio.wait_for(reader.read(), 2) == b""
        writer.close()
        await writer.wait_closed()
    finally:
        await proxy.close()
        server.close()
        await server.wait_closed()
    assert not proxy._tasks


async def test_a_target_that_cannot_be_reached_closes_the_client() -> None:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    proxy = LatencyProxy(target_port=port, delay=0.01)
    await proxy.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        assert await asyncio.wait_for(reader.read(), 2) == b""
        writer.close()
    finally:
        await proxy.close()


async def test_a_target_that_reads_nothing_holds_the_client_back() -> None:
    """A target that stops reading makes the proxy stop reading from the client (the kernel's
    buffers then hold the client back): what the proxy holds stays bounded, and every byte
    still arrives, in order, once the target reads again."""
    reading = asyncio.Event()
    got = bytearray()
    done = asyncio.Event()

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reading.wait()
        while data := await reader.read(1 << 16):
            got.extend(data)
        done.set()
        writer.close()

    server = await asyncio.start_server(slow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    proxy = LatencyProxy(target_port=port, delay=0.001)
    await proxy.start()
    sent = bytes(range(256)) * (32 * 4096)  # 32 MiB
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(sent)
        await asyncio.sleep(0.5)  # the client's bytes go as far as they can
        held = sum(s.transport.get_write_buffer_size() for s in proxy._sides if s.transport is not None)
        assert held < 4 << 20, f"the proxy holds {held} bytes for a target that reads nothing"
        reading.set()
        await writer.drain()
        writer.write_eof()
        await asyncio.wait_for(done.wait(), 30)
        assert bytes(got) == sent
        writer.close()
    finally:
        await proxy.close()
        server.close()
        await server.wait_closed()
