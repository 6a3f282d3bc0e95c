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
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources
from pathlib import Path

import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from nymph.queue.auth import Authenticator
from nymph.queue.console import app as console
from nymph.queue.db import Backend, Database
from nymph.queue.direct import wiring as direct
from nymph.queue.errors import Forbidden
from nymph.queue.http.answers import json_response
from nymph.queue.http.keys import AUTH, METRICS, OFFERS, PRINCIPAL, SESSIONS, SETTINGS, STORE
from nymph.queue.http.middlewares import auth_middleware, error_middleware
from nymph.queue.http.routes import catalog as catalog_routes
from nymph.queue.http.routes import daemon as daemon_routes
from nymph.queue.http.routes import dockyard as dockyard_routes
from nymph.queue.http.routes import events as event_routes
from nymph.queue.http.routes import groups as group_routes
from nymph.queue.http.routes import output as output_routes
from nymph.queue.http.routes import quota as quota_routes
from nymph.queue.http.routes import results as result_routes
from nymph.queue.http.routes import secrets as secret_routes
from nymph.queue.http.routes import user as user_routes
from nymph.queue.metrics import QueueMetrics
from nymph.queue.models import QueueSettings, Role
from nymph.queue.offers import OfferCache
from nymph.queue.sessions import SessionStore
from nymph.queue.store import Store

log = structlog.get_logger(__name__, component="queue.app")

SWEEPER_TASK = "nymph-queue-lease-sweeper"
SEEN_TASK = "nymph-queue-daemons-seen"
#: How often the daemons' last-seen refreshes that idle claims left due, and the session expiries
#: their calls extended, are written (a batch each).
SEEN_FLUSH_SECONDS = 5.0
LISTENER_TASK = "nymph-queue-db-listener"
OPENAPI_YAML = resources.files("nymph.queue").joinpath("openapi.yaml").read_bytes()


def open_backend(target: Path | str) -> tuple[Backend, Path | None]:
    """The database for ``--db``: a ``postgresql://`` URL, or a SQLite file (a path or
    ``sqlite:///PATH``). Returns it and the SQLite file's path (None on PostgreSQL)."""
    text = str(target)
    if text.startswith(("postgresql://", "postgres://")):
        from nymph.queue.pgdb import PgDatabase  # psycopg is needed only here

        return PgDatabase(url=text), None
    path = Path(text[len("sqlite:///") :] if text.startswith("sqlite:///") else text)
    return Database(path=path), path


async def healthz(request: web.Request) -> web.Response:
    await request.app[STORE].db.read(lambda conn: conn.execute("SELECT 1").fetchone())
    return json_response({"status": "ok"})


async def metrics(request: web.Request) -> web.Response:
    """The replica's Prometheus metrics (:mod:`nymph.queue.metrics`); an admin token."""
    if request[PRINCIPAL].role is not Role.ADMIN:
        raise Forbidden(
            "the queue's metrics take an admin token: create one on the queue host with "
            "'nymph queue token create --role admin'",
            code="admin_required",
        )
    body = generate_latest(request.app[METRICS].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def openapi(request: web.Request) -> web.Response:
    return web.Response(body=OPENAPI_YAML, content_type="application/yaml")


async def _database_ctx(app: web.Application) -> AsyncIterator[None]:
    store = app[STORE]
    await store.db.open()
    log.info("database open", db=store.db.describe)
    listener = None
    listen = getattr(store.db, "listen", None)
    if listen is not None:  # PostgreSQL: other replicas' changes wake long-polls here too
        ready = asyncio.Event()
        listener = asyncio.create_task(listen(store.woken_elsewhere, ready=ready), name=LISTENER_TASK)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                await ready.wait()
    yield
    if listener is not None:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(5):
            await store.drain_launches()  # batches under way answer their launches first
    await store.db.close()


async def _every(interval: float, run: Callable[[], Awaitable[object]], *, failed: str) -> None:
    """``run`` every ``interval`` seconds for ever; a failure is logged and tried again next time."""
    while True:
        await asyncio.sleep(interval)
        try:
            await run()
        except Exception:
            log.exception(failed)


async def _flush_seen(app: web.Application) -> None:
    """Write what the daemons' calls left due: their last-seen times, their sessions' expiries
    (the second is tried even if the first failed)."""
    try:
        await app[STORE].flush_seen()
    finally:
        await app[SESSIONS].flush_extended()


async def _sweeper_ctx(app: web.Application) -> AsyncIterator[None]:
    interval = app[SETTINGS].lease.sweep_interval
    store = app[STORE]
    task = asyncio.create_task(
        _every(interval, store.sweep, failed="lease sweep failed; retrying"), name=SWEEPER_TASK
    )
    seen = asyncio.create_task(
        _every(
            SEEN_FLUSH_SECONDS,
            functools.partial(_flush_seen, app),
            failed="writing the daemons' last-seen times or session expiries failed; retrying",
        ),
        name=SEEN_TASK,
    )
    yield
    for t in (task, seen):
        t.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await t
    try:
        await _flush_seen(app)
    except Exception as exc:  # the daemons claim again at the next replica, which records them
        log.warning(
            "daemons' last-seen times or session expiries not written at shutdown",
            error=type(exc).__name__,
        )


async def _release_long_polls(app: web.Application) -> None:
    app[STORE].close_waiters()
    log.info("shutting down: released held long-polls")


def create_app(*, db_path: Path | str, settings: QueueSettings | None = None) -> web.Application:
    """``db_path``: a SQLite file, ``sqlite:///PATH`` or a ``postgresql://`` URL."""
    settings = settings or QueueSettings()
    db, sqlite_path = open_backend(db_path)
    app = web.Application(
        middlewares=[error_middleware, auth_middleware],
        client_max_size=settings.limits.max_body_bytes,
    )
    app[SETTINGS] = settings
    app[STORE] = Store(db=db, settings=settings)
    app[AUTH] = Authenticator(db=db, cache_seconds=settings.limits.token_cache_seconds)
    app[SESSIONS] = SessionStore(settings=settings.sessions, db=db)
    app[METRICS] = QueueMetrics()
    app[OFFERS] = OfferCache()
    app[METRICS].watch_waiting(lambda: len(app[STORE].tasks_changed))
    app[STORE].count_launch_batches(app[METRICS].batch_written)
    app.cleanup_ctx.append(_database_ctx)
    app.cleanup_ctx.append(_sweeper_ctx)
    direct.install(app, store=app[STORE], db_path=sqlite_path)
    app.on_shutdown.append(_release_long_polls)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/openapi.yaml", openapi)
    app.router.add_get("/metrics", metrics)
    app.add_routes(catalog_routes.routes)
    app.add_routes(user_routes.routes)
    app.add_routes(dockyard_routes.routes)
    app.add_routes(daemon_routes.routes)
    app.add_routes(secret_routes.routes)
    app.add_routes(output_routes.routes)
    app.add_routes(event_routes.routes)
    app.add_routes(result_routes.routes)
    app.add_routes(quota_routes.routes)
    app.add_routes(group_routes.routes)
    console.install(app)
    return app
