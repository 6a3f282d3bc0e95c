"""Fixtures for the tests that run a queue service (the queue's own and the CLI's against it), as a
plugin (listed in tests/conftest.py).

``queue`` runs the service in the test's own event loop (for async tests); ``served`` runs it in
a background thread with its own loop (for the CLI and other synchronous callers). Both listen
on a free 127.0.0.1 port and keep their state in the backend the test is parametrized with
(``backend``): a SQLite file under ``tmp_path``, or a fresh database on the session's real
PostgreSQL server (:mod:`tests.support.pg_server`). A test marked ``sqlite_only`` runs on SQLite
alone (it inspects the database file itself), one marked ``postgresql_only`` on PostgreSQL alone
(what only that backend does, such as launch batches). The CLI's tests (``tests/cli``) run on
SQLite alone: the CLI speaks HTTP to the queue, and what differs between the backends behind the
same answers is the business of the queue's own tests, which run on both.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import structlog

from nymph.queue.models import QueueSettings
from tests.support.latency_proxy import LatencyProxy, running_proxy
from tests.support.pg_server import PgServer, PgUnavailable, running_server
from tests.support.queue_helpers import FAST, NO_SWEEPER, Queue, Served, add_kind, open_queue

BACKENDS = ("sqlite", "postgresql")
#: The test folders whose tests run on SQLite only (see the module's docstring).
SQLITE_ONLY_FOLDERS = ("cli",)
TESTS = Path(__file__).resolve().parents[1]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "sqlite_only: runs on the SQLite backend only")
    config.addinivalue_line("markers", "postgresql_only: runs on the PostgreSQL backend only")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames:
        folder = metafunc.definition.path.resolve().relative_to(TESTS).parts[0]
        only = (
            metafunc.definition.get_closest_marker("sqlite_only") is not None or folder in SQLITE_ONLY_FOLDERS
        )
        pg_only = metafunc.definition.get_closest_marker("postgresql_only") is not None
        backends = ["sqlite"] if only else ["postgresql"] if pg_only else list(BACKENDS)
        metafunc.parametrize("backend", backends, indirect=True)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """One real PostgreSQL server for the whole run (started on first use)."""
    try:
        ctx = running_server()
    except PgUnavailable as exc:
        pytest.skip(str(exc))
    with ctx as server:
        yield server


@pytest.fixture
def proxied(pg_server: PgServer) -> Iterator[tuple[str, LatencyProxy]]:
    """A fresh database on the session's server and a latency proxy in front of the server
    (1 ms each way, :mod:`tests.support.latency_proxy`); both gone at the end."""
    db = pg_server.fresh_database()
    socket = str(pg_server.socket_dir / f".s.PGSQL.{pg_server.port}")
    try:
        with running_proxy(target_unix=socket) as proxy:
            yield db, proxy
    finally:
        pg_server.drop_database(db)


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def queue_db(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path | str]:
    """Where the test's queue keeps its state: a SQLite file, or a fresh PostgreSQL database."""
    if backend == "sqlite":
        yield tmp_path / "queue.db"
        return
    server: PgServer = request.getfixturevalue("pg_server")
    url = server.fresh_database()
    try:
        yield url
    finally:
        server.drop_database(url)


@pytest.fixture
async def queue(tmp_path: Path, queue_db: Path | str) -> AsyncIterator[Queue]:
    q, runner = await open_queue(tmp_path, FAST, db=queue_db)
    try:
        yield q
    finally:
        await q.close()
        await runner.cleanup()


@pytest.fixture
async def kind(queue: Queue) -> Queue:
    """The queue with provider ``kind`` (kube namespace ``jobs``) and mode ``small``."""
    await add_kind(queue)
    return queue


@pytest.fixture
async def no_sweeper(tmp_path: Path, queue_db: Path | str) -> AsyncIterator[Queue]:
    """The queue with provider ``kind`` (kube namespace ``jobs``) and mode ``small``, on either
    backend, whose sweeper practically never runs: the test sweeps when it means to."""
    q, runner = await open_queue(tmp_path, NO_SWEEPER, db=queue_db)
    try:
        await add_kind(q)
        yield q
    finally:
        await q.close()
        await runner.cleanup()


@pytest.fixture
def served_settings() -> QueueSettings:
    """The settings ``served`` runs with (a test module overrides this fixture for others)."""
    return FAST


@pytest.fixture
def served(tmp_path: Path, queue_db: Path | str, served_settings: QueueSettings) -> Iterator[Served]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="queue-under-test", daemon=True)
    thread.start()
    opened = open_queue(tmp_path, served_settings, db=queue_db)
    q, runner = asyncio.run_coroutine_threadsafe(opened, loop).result(30)
    try:
        yield Served(
            url=q.url,
            db_path=q.db_path,
            user_token=q.user_token,
            daemon_token=q.daemon_token,
            loop=loop,
            admin_token=q.admin_token,
        )
    finally:
        asyncio.run_coroutine_threadsafe(q.close(), loop).result(10)
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.fixture
def cli_isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A CLI test sees no queue URL or token from the environment, and runs in its own directory."""
    monkeypatch.delenv("NYMPH_URL", raising=False)
    monkeypatch.delenv("NYMPH_TOKEN", raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def env(served: Served, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    """The served queue's URL and user token in the environment, as a user's shell has them."""
    monkeypatch.setenv("NYMPH_URL", served.url)
    monkeypatch.setenv("NYMPH_TOKEN", served.user_token)
    # The queue under test logs from its own thread, also between runs: keep that out of stdout.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    yield served
    structlog.reset_defaults()
