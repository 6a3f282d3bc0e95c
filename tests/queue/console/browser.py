"""The browser the console's tests drive: Debian's chromium (installed by tests/envtest/deps.sh)
through Playwright with ``executable_path``; a browser is never downloaded. One browser serves
a whole test module; each test opens its own context (cookies), closed when it ends.

Screenshots go under the test's tmp dir; with ``NYMPH_CONSOLE_SCREENSHOTS=DIR`` (``make
screenshots``) a copy of the few the manual shows lands in DIR too.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from nymph.client import QueueClient
from tests.support.queue_helpers import Served

T = TypeVar("T")
CHROMIUM = shutil.which("chromium")
SHOTS_ENV = "NYMPH_CONSOLE_SCREENSHOTS"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    required = os.environ.get("NYMPH_E2E", "").strip().lower() == "require"
    missing = None
    try:
        from playwright import sync_api
    except ImportError:
        missing = "Playwright for Python is not installed: run make install"
    if missing is None and CHROMIUM is None:
        missing = "Debian's chromium is not installed: run make deps"
    if missing is not None:
        if required:  # CI: a browser test never skips
            pytest.fail(f"NYMPH_E2E=require but {missing}", pytrace=False)
        pytest.skip(missing)
    args = ["--no-sandbox"] if os.geteuid() == 0 else []  # chromium refuses root without it
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=args)
        try:
            yield b
        finally:
            b.close()


class Shots:
    def __init__(self, tmp_path: Path) -> None:
        self.dir = tmp_path / "screenshots"
        self.dir.mkdir()
        extra = os.environ.get(SHOTS_ENV)
        self.extra = Path(extra) if extra else None

    def take(self, page: Any, name: str, *, docs: bool = False) -> Path:
        """A full-page PNG of ``page``; with ``docs``, one of the few the manual shows."""
        path = self.dir / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        if docs and self.extra is not None:
            self.extra.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, self.extra / path.name)
        return path


@pytest.fixture
def shots(tmp_path: Path) -> Shots:
    return Shots(tmp_path)


def on_queue(served: Served, token: str, call: Callable[[QueueClient], Awaitable[T]]) -> T:
    """``call`` with a client of ``token`` on the served queue's own loop."""

    async def run() -> T:
        client = QueueClient(base_url=served.url, token=token, timeout=20)
        try:
            return await call(client)
        finally:
            await client.close()

    return served.run(run())
