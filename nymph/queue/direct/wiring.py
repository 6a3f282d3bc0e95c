"""The direct path and the secret store in the app: typed app keys, and the background tasks
(the watch set and the reaper, each named and guarded) in the app's ``cleanup_ctx``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import structlog
from aiohttp import web

from nymph.queue.db import DIRECT_LOCK
from nymph.queue.direct.connect import Connector
from nymph.queue.direct.janitor import Janitor
from nymph.queue.direct.launcher import DirectDispatch
from nymph.queue.direct.podlogs import DirectLogs
from nymph.queue.direct.pulls import PullTimeouts
from nymph.queue.direct.watches import WatchManager
from nymph.queue.dispatcher import Dispatchers, QueuedDispatch
from nymph.queue.secrets import KeySource, SecretBox, default_key_file
from nymph.queue.secretstore import SecretStore
from nymph.queue.store import Store

log = structlog.get_logger(__name__, component="queue.direct")

DIRECT = web.AppKey("nymph.direct", DirectDispatch)
SECRETS = web.AppKey("nymph.secrets", SecretStore)
CONNECTOR = web.AppKey("nymph.connector", Connector)
DISPATCHERS = web.AppKey("nymph.dispatchers", Dispatchers)
WATCHES_TASK = "nymph-queue-direct-watches"
REAPER_TASK = "nymph-queue-direct-reaper"
#: Creates the Pods of direct launches their quota held back, as room frees up.
HELD_TASK = "nymph-queue-direct-held"
#: Stops direct launches whose image cannot be pulled (on the replica that runs the watches).
PULLS_TASK = "nymph-queue-direct-image-pulls"
DIRECT_TASK = "nymph-queue-direct"


async def guarded(name: str, run: Callable[[], Awaitable[None]]) -> None:
    """Run ``run`` until cancelled; a crash is logged and it starts again after a pause."""
    while True:
        try:
            await run()
            return
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("background task crashed; restarting", task=name)
            await asyncio.sleep(1.0)


def install(app: web.Application, *, store: Store, db_path: Path | None) -> None:
    """``db_path``: the SQLite file (its default key file sits beside it); None on PostgreSQL."""
    settings = store.settings.direct
    key_file = settings.secret_key_file
    if key_file:
        source = KeySource(path=key_file, create=False)
    elif db_path is not None:
        source = KeySource(path=default_key_file(db_path), create=True)
    else:
        source = KeySource(path=None, create=False)
    secrets = SecretStore(db=store.db, box=SecretBox(source=source))
    connector = Connector(secrets=secrets, settings=settings)
    followers = DirectLogs(store=store, connector=connector)
    watches = WatchManager(store=store, connector=connector, settings=settings, on_pod=followers.on_pod)
    janitor = Janitor(
        store=store,
        connector=connector,
        settings=settings,
        busy=followers.busy,
        serves_no_log=followers.serves_no_log,
    )
    pull_timeouts = PullTimeouts(store=store, connector=connector, interval=settings.interval)
    app[SECRETS] = secrets
    app[CONNECTOR] = connector
    app[DIRECT] = DirectDispatch(store=store, connector=connector, watches=watches)
    app[DISPATCHERS] = Dispatchers(store=store, queued=QueuedDispatch(store=store), direct=app[DIRECT])

    async def singleton() -> None:
        """The watches (with the direct log followers), the reaper, the release of held
        launches and the image-pull timeouts, on one replica at a time (all of them on SQLite)."""
        watches.active = True
        tasks = [
            asyncio.create_task(guarded(WATCHES_TASK, watches.run), name=WATCHES_TASK),
            asyncio.create_task(guarded(REAPER_TASK, janitor.run), name=REAPER_TASK),
            asyncio.create_task(guarded(HELD_TASK, app[DIRECT].run_held), name=HELD_TASK),
            asyncio.create_task(guarded(PULLS_TASK, pull_timeouts.run), name=PULLS_TASK),
        ]
        try:
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            watches.active = False
            await watches.close()
            await followers.close()  # the followers run where the watches run

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        await secrets.check()
        watches.active = False
        tasks = [asyncio.create_task(store.db.exclusive(DIRECT_LOCK, singleton), name=DIRECT_TASK)]
        yield
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        await watches.close()
        await followers.close()
        await connector.close()

    app.cleanup_ctx.append(ctx)
