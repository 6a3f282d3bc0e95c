"""The console's sub-application, mounted at ``/console`` on the queue's app (every replica,
both backends): its routes, its guard, its templates and its static files (shipped in the
package: nothing is fetched from elsewhere and nothing is built)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from aiohttp import web

from nymph.queue.console import actions, guard, pages, views
from nymph.queue.console.keys import TEMPLATES
from nymph.queue.direct.wiring import DISPATCHERS
from nymph.queue.http.keys import SETTINGS, STORE

STATIC = Path(str(resources.files("nymph.queue.console").joinpath("static")))


def install(app: web.Application) -> None:
    """Mount the console on ``app`` (after its store, settings and dispatchers are set)."""
    console = web.Application(middlewares=[guard.console_middleware])
    console[TEMPLATES] = views.environment()
    # The API handlers the console reuses read these from their own app.
    console[STORE] = app[STORE]
    console[SETTINGS] = app[SETTINGS]
    console[DISPATCHERS] = app[DISPATCHERS]
    console.on_response_prepare.append(guard.add_security_headers)
    console.router.add_get("/", actions.home, name="home")
    console.router.add_static("/static/", STATIC, name="static")
    console.add_routes(pages.routes)
    console.add_routes(actions.routes)
    app.router.add_get("/console", actions.bare)
    app.add_subapp("/console", console)
