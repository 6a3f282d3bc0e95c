"""A fake queue for the daemon under test: a small aiohttp server in a thread of the test.

It speaks the dispatch routes the daemon calls, with a behaviour the test picks (answer slowly,
with 5xx, with malformed task JSON, with hostile tasks, or instantly, ignoring the long-poll wait),
and records every request (route, time, body) so the test can count requests per second and see
what the daemon completed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from nymph.localcluster.cluster import free_port

Behaviour = Callable[[str, dict[str, Any]], Any]


@dataclass
class Seen:
    route: str
    at: float
    body: Any


@dataclass
class FakeQueue:
    """``claim_answer(n)`` returns what the n-th claim gets: a dict/list (sent as JSON), bytes (sent
    raw), an int (that HTTP status, empty body), or None (hold for the requested wait, no task)."""

    claim_answer: Callable[[int], Any] = lambda n: None
    status_for_all: int | None = None  # every route answers this status (5xx peers)
    delay: float = 0.0  # every answer is held this long first (slow peers)
    hang: frozenset[str] = frozenset()  # these routes never answer (within a minute)
    port: int = field(default_factory=free_port)
    daemon_token: str = "nyq_fake-daemon-token-for-the-peer-test"
    seen: list[Seen] = field(default_factory=list)
    _loop: asyncio.AbstractEventLoop | None = None
    _runner: web.AppRunner | None = None
    _thread: threading.Thread | None = None
    _claims: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def count(self, route: str, since: float = 0.0) -> int:
        return sum(1 for s in list(self.seen) if s.route == route and s.at >= since)

    def bodies(self, route: str) -> list[Any]:
        return [s.body for s in list(self.seen) if s.route == route]

    def completions(self) -> list[dict[str, Any]]:
        """Every completion the daemon sent, one at a time or in batches."""
        out = [b for b in self.bodies("complete") if isinstance(b, dict)]
        for batch in self.bodies("completions"):
            if isinstance(batch, dict):
                out.extend(c for c in batch.get("completions", []) if isinstance(c, dict))
        return out

    def max_per_second(self, since: float = 0.0) -> int:
        times = sorted(s.at for s in list(self.seen) if s.at >= since)
        best, j = 0, 0
        for i, t in enumerate(times):
            while times[j] < t - 1.0:
                j += 1
            best = max(best, i - j + 1)
        return best

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw
        route = request.path.rsplit("/", 1)[-1]
        self.seen.append(Seen(route, time.monotonic(), body))
        if self.delay:
            await asyncio.sleep(self.delay)
        if route in self.hang:
            await asyncio.sleep(60)
        if self.status_for_all is not None:
            return web.Response(status=self.status_for_all, text="upstream trouble")
        if route == "register":  # a well-behaved session; the misbehaviour is in the claims
            who = body if isinstance(body, dict) else {}
            return web.json_response(
                {
                    "sessionToken": "nys_fake",
                    "daemonId": who.get("daemonId", ""),
                    "node": who.get("node", ""),
                    "namespaces": who.get("namespaces", []),
                    "expiresAt": "2999-01-01T00:00:00.000Z",
                }
            )
        if route == "claim":
            n, self._claims = self._claims, self._claims + 1
            answer = self.claim_answer(n)
            if answer is None:
                wait = float((body or {}).get("wait", 0) if isinstance(body, dict) else 0)
                await asyncio.sleep(min(wait, 30))
                return web.json_response({"tasks": []})
            if isinstance(answer, int):
                return web.Response(status=answer)
            if isinstance(answer, bytes):
                return web.Response(body=answer, content_type="application/json")
            return web.json_response(answer)
        if route == "renew":
            ids = (body or {}).get("taskIds", []) if isinstance(body, dict) else []
            return web.json_response({"renewed": ids, "lost": []})
        if route == "release":
            ids = (body or {}).get("taskIds", []) if isinstance(body, dict) else []
            return web.json_response({"released": ids})
        if route == "complete":
            return web.json_response({"taskId": (body or {}).get("taskId"), "status": "done"})
        if route == "completions":  # the batch form: one answer per completion, in order
            items = (body or {}).get("completions", []) if isinstance(body, dict) else []
            answers = [
                {"taskId": c.get("taskId"), "httpStatus": 200, "body": {"status": "done"}}
                for c in items
                if isinstance(c, dict)
            ]
            return web.json_response({"answers": answers})
        if route == "report":
            reports = (body or {}).get("reports", []) if isinstance(body, dict) else []
            last = max((r.get("seq", 0) for r in reports), default=0)
            return web.json_response({"accepted": len(reports), "lastSeq": last})
        if route == "active":
            return web.json_response({"items": []})
        if route == "logs":
            return web.Response(status=204)
        return web.json_response({"status": "ok"})

    def __enter__(self) -> FakeQueue:
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()

        def serve() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", self._handle)
            self._runner = web.AppRunner(app, shutdown_timeout=0.5)
            self._loop.run_until_complete(self._runner.setup())
            self._loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, name="fake-queue", daemon=True)
        self._thread.start()
        assert ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        loop, runner = self._loop, self._runner
        if loop is None or runner is None:
            return
        fut = asyncio.run_coroutine_threadsafe(runner.cleanup(), loop)
        with contextlib.suppress(Exception):
            fut.result(10)
        # answers still held (a hanging route) end here, not as tasks destroyed with the loop
        rest = asyncio.run_coroutine_threadsafe(_cancel_the_rest(), loop)
        with contextlib.suppress(Exception):
            rest.result(10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread:
            self._thread.join(10)
        loop.close()


async def _cancel_the_rest() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
