"""The daemon's health server: /healthz, /readyz, /metrics. It reads a small view, not the daemon."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from nymph.daemon.metrics import Metrics
from nymph.netaddr import parse_listen


@dataclass(frozen=True)
class HealthView:
    """What the health routes read."""

    stale_after: float  # seconds without progress of the poll loop before /healthz fails
    last_progress: Callable[[], float]  # time.monotonic() of the poll loop's last turn
    queue_ok: Callable[[], bool]
    kube_ok: Callable[[], bool]
    reports_buffered: Callable[[], int]
    metrics: Metrics
    disk_problem: Callable[[], str | None] = lambda: None  # why the root cannot be written


VIEW_KEY: web.AppKey[HealthView] = web.AppKey("health-view", HealthView)


async def healthz(request: web.Request) -> web.Response:
    v = request.app[VIEW_KEY]
    age = time.monotonic() - v.last_progress()
    if age > v.stale_after:
        return web.json_response(
            {"ok": False, "detail": f"poll loop made no progress for {age:.0f}s"}, status=503
        )
    return web.json_response({"ok": True, "lastProgressSecondsAgo": round(age, 1)})


async def readyz(request: web.Request) -> web.Response:
    v = request.app[VIEW_KEY]
    queue_ok, kube_ok, disk_problem = v.queue_ok(), v.kube_ok(), v.disk_problem()
    body: dict[str, object] = {
        "queue": queue_ok,
        "kubernetes": kube_ok,
        "disk": disk_problem is None,
        "reportsBuffered": v.reports_buffered(),
    }
    if disk_problem is not None:
        body["diskProblem"] = disk_problem
    ok = queue_ok and kube_ok and disk_problem is None
    return web.json_response({"ok": ok, **body}, status=200 if ok else 503)


async def metrics(request: web.Request) -> web.Response:
    v = request.app[VIEW_KEY]
    v.metrics.reports_buffered.set(v.reports_buffered())
    return web.Response(
        body=generate_latest(v.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )


async def start_health_server(view: HealthView, *, listen: str) -> web.AppRunner:
    app = web.Application()
    app[VIEW_KEY] = view
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    host, port = parse_listen(listen, example="127.0.0.1:9700", default_host="127.0.0.1")
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner
