"""The CLI's standard-library transport: it speaks to the queue like the aiohttp one (JSON both
ways, the token sent, errors mapped to the same QueueError classes and messages), and a queue
that is unreachable, that hangs up mid-answer or that never answers gives the CLI's own message,
never a traceback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from nymph.client import QueueNotFound, QueueUnavailable, UserClient

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture
async def raw_server() -> AsyncIterator[Callable[[Handler], Awaitable[str]]]:
    servers: list[asyncio.Server] = []

    async def start(handler: Handler) -> str:
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        servers.append(server)
        return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()


async def _app_url(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"


async def test_json_both_ways_the_token_sent_and_errors_as_queue_errors() -> None:
    seen: dict[str, object] = {}

    async def echo(request: web.Request) -> web.Response:
        seen["auth"] = request.headers.get("Authorization")
        seen["body"] = await request.json()
        seen["query"] = dict(request.query)
        return web.json_response({"got": seen["body"]}, status=201)

    async def missing(_: web.Request) -> web.Response:
        return web.json_response({"error": "not_found", "detail": "no such instance x"}, status=404)

    app = web.Application()
    app.router.add_post("/v1/echo", echo)
    app.router.add_get("/v1/missing", missing)
    runner, url = await _app_url(app)
    try:
        async with UserClient(base_url=url, token="tok-123", light=True) as c:
            got = await c.request("POST", "/v1/echo", json={"a": [1, "é"]}, params={"limit": "5"})
            assert got == {"got": {"a": [1, "é"]}}
            assert seen == {"auth": "Bearer tok-123", "body": {"a": [1, "é"]}, "query": {"limit": "5"}}
            with pytest.raises(QueueNotFound) as err:
                await c.request("GET", "/v1/missing")
            assert err.value.status == 404 and "no such instance x" in str(err.value)
            assert "tok-123" not in str(err.value)
    finally:
        await runner.cleanup()


async def test_unreachable_hung_up_and_silent_queues_say_so(
    raw_server: Callable[[Handler], Awaitable[str]],
) -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"a"')
        await writer.drain()
        writer.close()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(30)

    async with UserClient(base_url="http://127.0.0.1:9", light=True) as c:
        with pytest.raises(QueueUnavailable, match="cannot reach the queue at http://127.0.0.1:9"):
            await c.request("GET", "/healthz")
    async with UserClient(base_url=await raw_server(hang_up), light=True) as c:
        with pytest.raises(QueueUnavailable, match="lost the connection to the queue"):
            await c.request("GET", "/healthz")
    async with UserClient(base_url=await raw_server(silent), light=True, timeout=0.5) as c:
        with pytest.raises(QueueUnavailable, match=r"did not answer within 0.5s"):
            await c.request("GET", "/healthz")


async def test_a_cancelled_call_returns_at_once(raw_server: Callable[[Handler], Awaitable[str]]) -> None:
    """Ctrl-C during a long-poll: the awaiting task is cancelled at once, the thread abandoned."""

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(30)

    async with UserClient(base_url=await raw_server(silent), light=True, timeout=60) as c:
        call = asyncio.ensure_future(c.request("GET", "/v1/instances?wait=50"))
        await asyncio.sleep(0.2)
        call.cancel()
        started = asyncio.get_running_loop().time()
        with pytest.raises(asyncio.CancelledError):
            await call
        # the server holds the call for 30 s: the command does not wait for it
        assert asyncio.get_running_loop().time() - started < 5.0
