"""Helpers for the queue tests: a real server on a free 127.0.0.1 port with a real SQLite file or
a real PostgreSQL database."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import logging
import re
import secrets
from collections.abc import Awaitable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import structlog
from aiohttp import web

from nymph.client import QueueClient
from nymph.queue.auth import create_token
from nymph.queue.http.app import create_app
from nymph.queue.http.keys import STORE
from nymph.queue.http.server import make_runner
from nymph.queue.models import LeaseSettings, QueueSettings, RetrySettings, Role, TenancySettings
from nymph.queue.store import Store

T = TypeVar("T")

#: The teams the queue tests use, each allowed the Kubernetes namespaces its tests launch into
#: (as an operator maps them with --kube-namespaces).
TEAMS = TenancySettings(
    kube_namespaces={
        "team-a": ("team-a", "jobs", "a-jobs", "ns-a"),
        "team-b": ("team-b", "jobs", "b-jobs"),
        "team-c": ("team-c", "jobs"),
    },
    # the example dockyard infra (manifests/examples) runs as this ServiceAccount
    service_accounts={"default": ("dockyard-rl",)},
)

FAST = QueueSettings(
    lease=LeaseSettings(sweep_interval=0.2, stop_node_fallback=1.0),
    retry=RetrySettings(max_attempts=3, backoff_base=0.2, backoff_max=1.0),
    tenancy=TEAMS,
)


#: FAST, with a sweeper that practically never runs (a test sweeps when it means to).
NO_SWEEPER = dataclasses.replace(FAST, lease=dataclasses.replace(FAST.lease, sweep_interval=3600.0))


REGISTER = "/v1/dispatch/register"
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def identity_of(body: Any, path: str = "") -> tuple[str, str, tuple[str, ...]]:
    """The daemon a raw dispatch call acts as: the body's daemonId, node and namespaces (or the
    ``node`` query), with d1 / n1 / () for values absent or invalid (so the route validates them)."""
    data = body if isinstance(body, dict) else {}
    daemon_id = data.get("daemonId")
    node = data.get("node")
    if node is None and "node=" in path:
        node = path.split("node=", 1)[1].split("&", 1)[0]
    namespaces = data.get("namespaces")
    if not isinstance(namespaces, list) or not all(
        isinstance(n, str) and _LABEL.match(n) for n in namespaces
    ):
        namespaces = []
    return (
        daemon_id if isinstance(daemon_id, str) and daemon_id.strip() else "d1",
        node if isinstance(node, str) else "n1",
        tuple(namespaces),
    )


@dataclass
class Answer:
    status: int
    body: Any
    text: str


@dataclass
class Queue:
    """A running queue service and handy ways to talk to it."""

    url: str
    db_path: Path
    app: web.Application
    user_token: str
    daemon_token: str
    backend: str = "sqlite"
    #: An admin token (namespaces' quotas; every user route in every namespace).
    admin_token: str = ""
    _clients: list[QueueClient] = field(default_factory=list)
    _session: aiohttp.ClientSession | None = None
    _sessions: dict[tuple[str, str, tuple[str, ...], str], str] = field(default_factory=dict)

    @property
    def store(self) -> Store:
        return self.app[STORE]

    async def token(self, role: Role, namespace: str | None = None, name: str | None = None) -> str:
        created = await self.store.db.write(
            lambda conn: create_token(conn, role=role, namespace=namespace, name=name)
        )
        return created.token

    def client(self, token: str | None = "user", namespace: str = "default") -> QueueClient:
        if token == "user":
            token = self.user_token
        elif token == "daemon":
            token = self.daemon_token
        c = QueueClient(base_url=self.url, token=token, namespace=namespace, timeout=20)
        self._clients.append(c)
        return c

    def user(self, namespace: str = "default") -> QueueClient:
        return self.client("user", namespace)

    def daemon(self) -> QueueClient:
        return self.client("daemon")

    async def session(
        self, daemon_id: str = "d1", node: str = "n1", namespaces: tuple[str, ...] = (), token: str = "daemon"
    ) -> str:
        """A daemon session credential for this identity (registered once, then reused)."""
        key = (daemon_id, node, namespaces, token)
        if key not in self._sessions:
            r = await self.call(
                "POST",
                REGISTER,
                token=token,
                json_body={"daemonId": daemon_id, "node": node, "namespaces": list(namespaces)},
            )
            assert r.status == 201, r.body
            self._sessions[key] = r.body["sessionToken"]
        return self._sessions[key]

    async def call(
        self,
        method: str,
        path: str,
        *,
        token: str | None = "user",
        json_body: Any = None,
        data: bytes | str | None = None,
        headers: dict[str, str] | None = None,
    ) -> Answer:
        """A raw HTTP call, for checking statuses and error bodies exactly. ``token="daemon"``
        on a dispatch route uses a session registered as the body's daemonId / node / namespaces
        (d1 / n1 / every namespace when absent or invalid)."""
        if self._session is None:
            self._session = aiohttp.ClientSession()
        hdrs = dict(headers or {})
        if token == "daemon" and path.startswith("/v1/dispatch/") and path != REGISTER:
            token = await self.session(*identity_of(json_body, path))
        if token == "user":
            token = self.user_token
        elif token == "daemon":
            token = self.daemon_token
        if token is not None:
            hdrs["Authorization"] = f"Bearer {token}"
        if json_body is not None:
            data = json.dumps(json_body)
            hdrs.setdefault("Content-Type", "application/json")
        async with self._session.request(method, self.url + path, data=data, headers=hdrs) as resp:
            text = await resp.text()
            try:
                body = json.loads(text) if text else None
            except ValueError:
                body = None
            return Answer(status=resp.status, body=body, text=text)

    async def raw_state(self) -> bytes:
        """Everything the queue stored, as bytes: the SQLite files, or every PostgreSQL row."""
        if self.backend == "sqlite":
            return b"".join(p.read_bytes() for p in self.db_path.parent.glob(self.db_path.name + "*"))

        def dump(conn: Any) -> str:
            tables = conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
            ).fetchall()
            return repr([conn.execute(f"SELECT * FROM {t[0]}").fetchall() for t in tables])

        return (await self.store.db.read(dump)).encode()

    async def close(self) -> None:
        for c in self._clients:
            await c.close()
        if self._session is not None:
            await self._session.close()


async def start_app(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = make_runner(app, shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"


async def open_queue(
    tmp_path: Path, settings: QueueSettings, *, db: Path | str | None = None
) -> tuple[Queue, web.AppRunner]:
    """A queue on ``db`` (a SQLite file or a PostgreSQL URL; default ``tmp_path/queue.db``)."""
    db = tmp_path / "queue.db" if db is None else db
    if isinstance(db, str) and settings.direct.secret_key_file is None:
        # Replicas on PostgreSQL share no disk: the secret key is always a file they all mount.
        key = tmp_path / "secret-key"
        if not key.exists():
            key.write_text(base64.urlsafe_b64encode(secrets.token_bytes(32)).decode() + "\n")
        settings = dataclasses.replace(
            settings, direct=dataclasses.replace(settings.direct, secret_key_file=key)
        )
    app = create_app(db_path=db, settings=settings)
    runner, url = await start_app(app)
    store = app[STORE]
    user = await store.db.write(lambda conn: create_token(conn, role=Role.USER, name="alice"))
    daemon = await store.db.write(lambda conn: create_token(conn, role=Role.DAEMON))
    admin = await store.db.write(lambda conn: create_token(conn, role=Role.ADMIN, name="ops"))
    q = Queue(
        url=url,
        db_path=tmp_path / "queue.db",
        app=app,
        user_token=user.token,
        daemon_token=daemon.token,
        backend="sqlite" if isinstance(db, Path) else "postgresql",
        admin_token=admin.token,
    )
    return q, runner


async def add_kind(
    q: Queue, *, namespace: str = "default", kube_ns: str = "jobs", token: str = "user"
) -> None:
    """Provider ``kind`` (kube namespace ``kube_ns``) and mode ``small`` (python image)."""
    r = await q.call(
        "POST",
        f"/v1/namespaces/{namespace}/providers",
        token=token,
        json_body={
            "name": "kind",
            "launcher": "Kube",
            "dispatch": "daemon",
            "kwargs": {"namespace": kube_ns},
        },
    )
    assert r.status == 201, r.body
    r = await q.call(
        "POST",
        f"/v1/namespaces/{namespace}/modes",
        token=token,
        json_body={"name": "small", "provider": "kind", "fields": {"image": "python:3.12-slim"}},
    )
    assert r.status == 201, r.body


# --- a server in a background thread, for synchronous callers ----------------------------------


@dataclass
class Served:
    url: str
    db_path: Path
    user_token: str
    daemon_token: str
    loop: asyncio.AbstractEventLoop
    admin_token: str = ""

    def run(self, coro: Awaitable[T], timeout: float = 30.0) -> T:
        fut: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)  # type: ignore[arg-type]
        return fut.result(timeout)

    def spawn(self, coro: Awaitable[T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)  # type: ignore[arg-type]

    def client(self, token: str) -> QueueClient:
        return QueueClient(base_url=self.url, token=token, timeout=20)


def run_cli(capsys: Any, *argv: str) -> tuple[int, str, str]:
    """``nymph ARGV`` in this process (console logs at warning level): its exit code, stdout and
    stderr; structlog is set back to warnings only afterwards (main() pointed it at stderr)."""
    from nymph.cli import main

    try:
        code = main(["--log-format", "console", "--log-level", "warning", *argv])
    finally:
        structlog.reset_defaults()
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    out, err = capsys.readouterr()
    return code, out, err
