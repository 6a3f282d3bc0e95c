"""Named, guarded background tasks: a crash is logged and the loop restarts with backoff."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from nymph.logsetup import get_logger


def guarded(name: str, factory: Callable[[], Awaitable[None]], *, restart: bool = True) -> asyncio.Task[None]:
    log = get_logger("tasks", task=name)

    async def runner() -> None:
        backoff = 0.5
        while True:
            try:
                await factory()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("background task crashed", restart=restart)
                if not restart:
                    raise
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)

    return asyncio.create_task(runner(), name=name)


async def cancel_all(tasks: list[asyncio.Task[None]], *, timeout: float = 5.0) -> None:
    for t in tasks:
        t.cancel()
    if tasks:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout)
