"""The daemon's health server: /healthz, /readyz, /metrics."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from nymph.errors import ConfigError

if TYPE_CHECKING:
    from nymph.daemon.core import Daemon

DAEMON_KEY: web.AppKey[Daemon] = web.AppKey("daemon")


async def healthz(request: web.Request) -> web.Response:
    d = request.app[DAEMON_KEY]
    limit = d.s.healthz_stale_polls * (d.s.queue.poll_wait + 10)
    age = time.monotonic() - d.last_progress
    if age > limit:
        return web.json_response(
            {"ok": False, "detail": f"poll loop made no progress for {age:.0f}s"}, status=503
        )
    return web.json_response({"ok": True, "lastProgressSecondsAgo": round(age, 1)})


async def readyz(request: web.Request) -> web.Response:
    d = request.app[DAEMON_KEY]
    kube_ok = bool(d.watchers) and all(w.connected for w in d.watchers.values())
    body = {"queue": d.queue_ok, "kubernetes": kube_ok, "reportsBuffered": d.outbox.pending}
    return web.json_response(
        {"ok": d.queue_ok and kube_ok, **body}, status=200 if d.queue_ok and kube_ok else 503
    )


async def metrics(request: web.Request) -> web.Response:
    d = request.app[DAEMON_KEY]
    d.metrics.reports_buffered.set(d.outbox.pending)
    return web.Response(
        body=generate_latest(d.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )


def parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"--listen {listen!r}: expected HOST:PORT, e.g. 127.0.0.1:9700")
    return host or "127.0.0.1", int(port)


async def start_health_server(daemon: Daemon, listen: str) -> web.AppRunner:
    app = web.Application()
    app[DAEMON_KEY] = daemon
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    host, port = parse_listen(listen)
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner
