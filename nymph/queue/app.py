"""The queue service's aiohttp application factory.

``create_app(db_path=..., settings=...)`` wires the store, the auth and error middlewares,
the user and dispatch routes, the lease sweeper (a named background task in ``cleanup_ctx``)
and, on shutdown, the release of every held long-poll so a graceful stop never waits for them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from importlib import resources
from pathlib import Path

import structlog
from aiohttp import web

from nymph.queue import dispatch_routes, routes
from nymph.queue.auth import Authenticator, Handler, auth_middleware
from nymph.queue.db import Database
from nymph.queue.errors import ServiceError
from nymph.queue.keys import AUTH, SETTINGS, STORE
from nymph.queue.models import QueueSettings
from nymph.queue.store import Store

log = structlog.get_logger(__name__, component="queue.app")

SWEEPER_TASK = "nymph-queue-lease-sweeper"
OPENAPI_YAML = resources.files("nymph.queue").joinpath("openapi.yaml").read_bytes()

_HTTP_CODES = {
    400: ("bad_request", "the request is malformed"),
    404: ("not_found", "no such route: see GET /openapi.yaml for the API"),
    405: ("method_not_allowed", "this route does not take that method: see GET /openapi.yaml"),
    413: ("too_large", "the request body is too large: send less"),
}


def error_body(*, code: str, detail: str) -> dict[str, str]:
    return {"error": code, "detail": detail}


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ServiceError as exc:
        return web.json_response(error_body(code=exc.code, detail=exc.detail), status=exc.status)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code, detail = _HTTP_CODES.get(exc.status, ("http_error", exc.reason))
        headers = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
        return web.json_response(error_body(code=code, detail=detail), status=exc.status, headers=headers)
    except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
        raise
    except Exception:
        log.exception("unhandled error", method=request.method, path=request.path)
        return web.json_response(
            error_body(code="internal", detail="the queue hit an unexpected error: see its log"),
            status=500,
        )


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
    app.cleanup_ctx.append(_database_ctx)
    app.cleanup_ctx.append(_sweeper_ctx)
    app.on_shutdown.append(_release_long_polls)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/openapi.yaml", openapi)
    app.add_routes(routes.routes)
    app.add_routes(dispatch_routes.routes)
    return app
