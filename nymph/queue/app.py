"""The queue service's aiohttp application factory.

``create_app(db_path=..., settings=...)`` wires the store, the auth and error middlewares,
the user, secret and dispatch routes, the lease sweeper (a named background task in
``cleanup_ctx``), the direct path (:mod:`nymph.queue.direct.wiring`: its watch set and reaper,
also named background tasks) and, on shutdown, the release of every held long-poll so a
graceful stop never waits for them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from importlib import resources
from pathlib import Path

import structlog
from aiohttp import web

from nymph.queue.auth import Authenticator
from nymph.queue.db import Database
from nymph.queue.direct import wiring as direct
from nymph.queue.keys import AUTH, SESSIONS, SETTINGS, STORE
from nymph.queue.middlewares import auth_middleware, error_middleware
from nymph.queue.models import QueueSettings
from nymph.queue.routes import daemon as daemon_routes
from nymph.queue.routes import output as output_routes
from nymph.queue.routes import results as result_routes
from nymph.queue.routes import secrets as secret_routes
from nymph.queue.routes import user as user_routes
from nymph.queue.sessions import SessionStore
from nymph.queue.store import Store

log = structlog.get_logger(__name__, component="queue.app")

SWEEPER_TASK = "nymph-queue-lease-sweeper"
OPENAPI_YAML = resources.files("nymph.queue").joinpath("openapi.yaml").read_bytes()


async def healthz(request: web.Request) -> web.Response:
    await request.app[STORE].db.read(lambda conn: conn.execute("SELECT 1").fetchone())
    return web.json_response({"status": "ok"})


async def openapi(request: web.Request) -> web.Response:
    return web.Response(body=OPENAPI_YAML, content_type="application/yaml")


async def _database_ctx(app: web.Application) -> AsyncIterator[None]:
    store = app[STORE]
    await store.db.open()
    log.info("database open", path=str(store.db.path))
    yield
    await store.db.close()


async def _sweep_forever(store: Store, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        try:
            await store.sweep()
        except Exception:
            log.exception("lease sweep failed; retrying")


async def _sweeper_ctx(app: web.Application) -> AsyncIterator[None]:
    interval = app[SETTINGS].lease.sweep_interval
    task = asyncio.create_task(_sweep_forever(app[STORE], interval), name=SWEEPER_TASK)
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _release_long_polls(app: web.Application) -> None:
    app[STORE].close_waiters()
    log.info("shutting down: released held long-polls")


def create_app(*, db_path: Path, settings: QueueSettings | None = None) -> web.Application:
    settings = settings or QueueSettings()
    db = Database(path=Path(db_path))
    app = web.Application(
        middlewares=[error_middleware, auth_middleware],
        client_max_size=settings.limits.max_body_bytes,
    )
    app[SETTINGS] = settings
    app[STORE] = Store(db=db, settings=settings)
    app[AUTH] = Authenticator(db=db, cache_seconds=settings.limits.token_cache_seconds)
    app[SESSIONS] = SessionStore(settings=settings.sessions)
    app.cleanup_ctx.append(_database_ctx)
    app.cleanup_ctx.append(_sweeper_ctx)
    direct.install(app, store=app[STORE], db_path=Path(db_path))
    app.on_shutdown.append(_release_long_polls)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/openapi.yaml", openapi)
    app.add_routes(user_routes.routes)
    app.add_routes(daemon_routes.routes)
    app.add_routes(secret_routes.routes)
    app.add_routes(output_routes.routes)
    app.add_routes(result_routes.routes)
    return app
