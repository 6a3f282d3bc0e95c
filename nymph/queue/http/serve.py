"""Running the service: bind, announce the URL, stop gracefully on SIGTERM / SIGINT.

Signals only set an event; shutdown then stops accepting connections, releases every held
long-poll (claims answer ``{"tasks": []}``, instance polls answer the current instance), waits
up to ``shutdown_timeout`` for in-flight requests, and closes the database. Work handed to
threads (``asyncio.to_thread``) runs on a :class:`~nymph.queue.threads.BoundedExecutor`, whose
shutdown does not wait for it, and renders not started yet are refused first (503): the process
exits within the grace period whatever a thread does.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import platformdirs
import structlog
from aiohttp import web

from nymph import netaddr
from nymph.errors import ConfigError
from nymph.eventloop import running_loop_name
from nymph.queue.http.app import create_app
from nymph.queue.http.keys import STORE
from nymph.queue.http.server import make_runner
from nymph.queue.models import QueueSettings
from nymph.queue.threads import BoundedExecutor, start_cpu, stop_cpu

log = structlog.get_logger(__name__, component="queue.serve")

DEFAULT_LISTEN = netaddr.DEFAULT_LISTEN


def default_db_path() -> Path:
    return platformdirs.user_data_path("nymph") / "queue.db"


def _url(host: str, port: int) -> str:
    return f"http://{netaddr.url_host(host)}:{port}"


async def serve(
    *,
    db_path: Path | str,
    host: str,
    port: int,
    settings: QueueSettings | None = None,
    shutdown_timeout: float = 10.0,
) -> None:
    loop = asyncio.get_running_loop()
    loop.set_default_executor(BoundedExecutor())
    start_cpu()
    app = create_app(db_path=db_path, settings=settings)
    runner = make_runner(app, handle_signals=False, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError as exc:
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        bound = runner.addresses[0]
        url = _url(host, int(bound[1]))
        where = app[STORE].db.describe
        print(f"nymph queue: serving on {url} (db {where}; web console {url}/console/)", flush=True)
        log.info("serving", url=url, db=where, event_loop=running_loop_name())
        await stop.wait()
        log.info("stopping")
    finally:
        stop_cpu()  # renders not started yet are answered at once; running ones end on budget
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await runner.cleanup()
    print("nymph queue: stopped", file=sys.stderr, flush=True)
