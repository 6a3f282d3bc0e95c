"""The benchmarks' lean load generator reads what an aiohttp server answers, keeps its
connections for the next requests, and says so when an answer cannot be read."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from benchmarks.rawpost import RawPoster, RawPostError


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, list[tuple[str, str, object]]]]:
    seen: list[tuple[str, str, object]] = []
    peers: set[object] = set()

    async def echo(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append((request.path, request.headers["Authorization"], body))
        assert request.transport is not None
        peers.add(request.transport.get_extra_info("peername"))
        if body.get("status"):
            return web.json_response({"got": body, "peers": len(peers)}, status=int(body["status"]))
        if body.get("chunked"):
            response = web.StreamResponse()
            response.enable_chunked_encoding()
            await response.prepare(request)
            await response.write(b"{}")
            return response
        return web.json_response({"got": body, "peers": len(peers)})

    app = web.Application()
    app.router.add_post("/v1/echo", echo)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


async def test_answers_in_order_on_kept_connections(
    server: tuple[str, list[tuple[str, str, object]]],
) -> None:
    """16 POSTs at once each get their own answer, with the token and body sent; 16 more reuse
    the same 16 connections, and a status other than 200 is passed on with its body."""
    url, seen = server
    poster = RawPoster(url, "tok-1")
    try:
        first = await asyncio.gather(
            *(poster.post("/v1/echo", {"n": n, "pad": "x" * n * 500}) for n in range(16))
        )
        assert [(status, got["got"]["n"]) for status, got in first] == [(200, n) for n in range(16)]
        again = await asyncio.gather(*(poster.post("/v1/echo", {"n": n}) for n in range(16)))
        assert max(got["peers"] for _, got in again) == 16
        assert {auth for _, auth, _ in seen} == {"Bearer tok-1"}
        status, got = await poster.post("/v1/echo", {"status": 409})
        assert (status, got["got"]) == (409, {"status": 409})
    finally:
        poster.close()


async def test_an_answer_without_a_length_is_an_error(
    server: tuple[str, list[tuple[str, str, object]]],
) -> None:
    url, _ = server
    poster = RawPoster(url, "tok-1")
    try:
        with pytest.raises(RawPostError, match="Content-Length"):
            await asyncio.wait_for(poster.post("/v1/echo", {"chunked": True}), 10)
    finally:
        poster.close()
