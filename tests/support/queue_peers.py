"""A real queue process with tokens for two tenants, and a checked HTTP sender.

Every answer the fault tests get from the queue goes through :meth:`Checked.send`, which counts
the request as a bad input tried (when it is one), counts any 5xx, and checks that every error is
a documented 4xx with a JSON body ``{error, detail}`` (two non-empty strings). A request that
gets no HTTP answer at all (a reset connection) is counted with the 5xx.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from tests.support.harness import QueueProc, nymph
from tests.support.tally import TALLY

TENANTS = ("team-a", "team-b")


def make_token(db: Path, *, role: str, namespace: str | None = None, name: str | None = None) -> str:
    args = ["queue", "token", "create", "--db", str(db), "--role", role]
    if namespace:
        args += ["--namespace", namespace]
    if name:
        args += ["--name", name]
    return nymph(*args, check=True).stdout.strip().splitlines()[-1].split()[-1]


@dataclass
class Tenants:
    queue: QueueProc
    user: dict[str, str] = field(default_factory=dict)  # namespace -> user token scoped to it
    daemon: dict[str, str] = field(default_factory=dict)  # namespace -> daemon token scoped to it

    @property
    def url(self) -> str:
        return self.queue.url


def start_tenants(tmp: Path) -> Tenants:
    # each team's scoped token launches into its own kube namespace, as an operator maps it
    mapping = [arg for ns in TENANTS for arg in ("--kube-namespaces", f"{ns}=jobs-{ns}")]
    q = QueueProc(tmp / "queue.db", extra=tuple(mapping))
    q.tokens()
    t = Tenants(q)
    for ns in TENANTS:
        t.user[ns] = make_token(q.db, role="user", namespace=ns, name=f"user-{ns}")
        t.daemon[ns] = make_token(q.db, role="daemon", namespace=ns)
    q.start()
    asyncio.run(_catalog(t))
    return t


async def _catalog(t: Tenants) -> None:
    from nymph.client import QueueClient

    for ns in TENANTS:
        async with QueueClient(base_url=t.url, token=t.user[ns], namespace=ns) as c:
            await c.create_provider(
                name="local", launcher="Kube", kwargs={"namespace": f"jobs-{ns}"}, dispatch="daemon"
            )
            await c.create_mode(name="py", provider="local", fields={"image": "python:3.12-slim"})


@dataclass
class Checked:
    base: str
    session: requests.Session = field(default_factory=requests.Session)
    failures: list[str] = field(default_factory=list)

    def send(
        self,
        method: str,
        path: str,
        *,
        token: str | None,
        bad: bool = True,
        data: bytes | None = None,
        json_body: Any = None,
        headers: dict[str, str] | None = None,
        timeout: float = 30,
    ) -> requests.Response:
        hdrs = dict(headers or {})
        if token:
            hdrs["Authorization"] = f"Bearer {token}"
        if bad:
            TALLY.bad_inputs += 1
        try:
            if json_body is not None:
                resp = self.session.request(
                    method, self.base + path, json=json_body, headers=hdrs, timeout=timeout
                )
            else:
                resp = self.session.request(
                    method, self.base + path, data=data, headers=hdrs, timeout=timeout
                )
        except requests.ConnectionError as exc:
            # No HTTP answer at all (the connection was reset): counted with the 5xx.
            TALLY.server_errors += 1
            self.failures.append(f"{method} {path[:120]}: no answer ({type(exc).__name__})")
            self.session = requests.Session()
            resp = requests.Response()
            resp.status_code = 599
            return resp
        self.check(resp, f"{method} {path[:120]}")
        return resp

    def check(self, resp: requests.Response, what: str) -> None:
        if resp.status_code == 599:  # no answer, already counted
            return
        if resp.status_code >= 500:
            TALLY.server_errors += 1
            self.failures.append(f"{what}: {resp.status_code} {resp.text[:200]!r}")
            return
        if resp.status_code >= 400:
            problem = error_shape_problem(resp)
            if problem:
                self.failures.append(f"{what}: {resp.status_code} {problem}")


def error_shape_problem(resp: requests.Response) -> str | None:
    try:
        body = resp.json()
    except ValueError:
        return f"not JSON ({resp.headers.get('Content-Type')}): {resp.text[:120]!r}"
    if not isinstance(body, dict):
        return f"not an object: {body!r:.120}"
    for key in ("error", "detail"):
        if not isinstance(body.get(key), str) or not body[key]:
            return f"no {key!r} string: {body!r:.200}"
    return None
