"""A throttling front for the API server: an HTTPS proxy that answers 429 while told to.

The LocalCluster runs kube-apiserver with API Priority and Fairness off, and its
``--max-requests-inflight`` only throttles under concurrency this test cannot produce on
purpose, so the 429s come from this proxy instead: it serves with the API server's own
certificate (valid for 127.0.0.1), forwards every request (bearer token included) to the real
server, streams watches through, and while ``throttling`` is set answers every request that is
not a watch with ``429 Too Many Requests`` and ``Retry-After: 1``, the way a busy API server
does. It counts every request, so the test can see whether the daemon (and its kubectl
children) back off.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import yaml
from aiohttp import web

from nymph.localcluster import LocalCluster
from nymph.localcluster.cluster import free_port

_HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding"}


@dataclass
class ThrottlingProxy:
    kube: LocalCluster
    port: int = field(default_factory=free_port)
    throttling: bool = False
    #: While set, a new watch gets its headers and then nothing (a half-open connection).
    stalling: bool = False
    times: list[tuple[float, bool]] = field(default_factory=list)  # (when, answered 429)
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _runner: web.AppRunner | None = None
    _session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def kubeconfig(self, source: Path, dest: Path) -> Path:
        config = yaml.safe_load(source.read_text())
        for c in config["clusters"]:
            c["cluster"]["server"] = self.url
        dest.write_text(yaml.safe_dump(config))
        dest.chmod(0o600)
        return dest

    def max_per_second(self, since: float) -> int:
        times = sorted(t for t, _ in list(self.times) if t >= since)
        best, j = 0, 0
        for i, t in enumerate(times):
            while times[j] < t - 1.0:
                j += 1
            best = max(best, i - j + 1)
        return best

    def count(self, since: float, *, throttled: bool | None = None) -> int:
        return sum(1 for t, th in list(self.times) if t >= since and (throttled is None or th == throttled))

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        watch = request.query.get("watch") in ("1", "true")
        throttled = self.throttling and not watch
        self.times.append((time.monotonic(), throttled))
        if throttled:
            return web.json_response(
                {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "TooManyRequests", "code": 429,
                 "message": "too many requests, please try again later"},
                status=429,
                headers={"Retry-After": "1"},
            )  # fmt: skip
        if self.stalling and request.query.get("watch", "").lower() in ("1", "true"):
            resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
            await resp.prepare(request)
            while self.stalling:  # noqa: ASYNC110 - the flag is set from another thread
                await asyncio.sleep(0.1)
            return resp
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        body = await request.read()
        async with self._session.request(
            request.method,
            self.kube.server + request.path_qs,
            headers=headers,
            data=body or None,
            timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
        ) as upstream:
            resp = web.StreamResponse(
                status=upstream.status,
                headers={k: v for k, v in upstream.headers.items() if k.lower() not in _HOP},
            )
            await resp.prepare(request)
            async for chunk in upstream.content.iter_any():
                await resp.write(chunk)
            with contextlib.suppress(ConnectionError):
                await resp.write_eof()
            return resp

    def __enter__(self) -> ThrottlingProxy:
        assert self.kube.pki is not None
        pki = self.kube.pki
        server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ctx.load_cert_chain(str(pki.serving_cert), str(pki.serving_key))
        client_ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()

        errors: list[BaseException] = []

        async def setup() -> None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_ctx))
            app = web.Application(client_max_size=64 * 1024 * 1024)
            app.router.add_route("*", "/{tail:.*}", self._handle)
            self._runner = web.AppRunner(app, shutdown_timeout=0.5)
            await self._runner.setup()
            await web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=server_ctx).start()

        def serve() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(setup())
            except BaseException as exc:
                errors.append(exc)
                ready.set()
                return
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, name="throttling-proxy", daemon=True)
        self._thread.start()
        assert ready.wait(10) and not errors, f"the throttling proxy did not start: {errors}"
        return self

    def __exit__(self, *exc: object) -> None:
        loop = self._loop
        if loop is None:
            return

        async def close() -> None:
            if self._runner is not None:
                await self._runner.cleanup()
            if self._session is not None:
                await self._session.close()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread:
            self._thread.join(10)
        if not loop.is_running():
            loop.close()
