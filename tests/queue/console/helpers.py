"""A browser-less console client for the queue tests: a cookie jar, the sign-in form and the
CSRF token a page's forms carry, over real HTTP."""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field

import aiohttp

from tests.support.queue_helpers import Queue

_CSRF = re.compile(r'name="csrf" value="([^"]*)"')
CSP = "Content-Security-Policy"


@dataclass
class Page:
    status: int
    text: str
    headers: dict[str, str]
    set_cookies: list[str] = field(default_factory=list)

    @property
    def csrf(self) -> str:
        found = _CSRF.search(self.text)
        assert found is not None, "no form with a CSRF token on this page"
        return found.group(1)


class Console:
    """One browser session of the console (its own cookie jar)."""

    def __init__(self, queue: Queue) -> None:
        self.url = queue.url
        self.http = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))

    async def close(self) -> None:
        await self.http.close()

    async def get(self, path: str, **kw: object) -> Page:
        async with self.http.get(self.url + path, allow_redirects=False, **kw) as r:  # type: ignore[arg-type]
            return Page(r.status, await r.text(), dict(r.headers), r.headers.getall("Set-Cookie", []))

    async def post(self, path: str, data: dict[str, str], **kw: object) -> Page:
        async with self.http.post(self.url + path, data=data, allow_redirects=False, **kw) as r:  # type: ignore[arg-type]
            return Page(r.status, await r.text(), dict(r.headers), r.headers.getall("Set-Cookie", []))

    async def sign_in(self, token: str) -> Page:
        form = await self.get("/console/")
        return await self.post("/console/signin", {"csrf": form.csrf, "token": token})


async def ship_output(
    q: Queue, instance_id: str, *, log: bytes, result: tuple[str, bytes] | None = None
) -> None:
    """Log (final) and a result file for an instance, sent as its daemon d1 sends them."""
    chunk = {"daemonId": "d1", "instanceId": instance_id, "offset": 0, "data": base64.b64encode(log).decode()}
    r = await q.call("POST", "/v1/dispatch/logchunks", token="daemon", json_body={**chunk, "final": True})
    assert r.status == 200, r.body
    if result is not None:
        body = {
            "daemonId": "d1",
            "instanceId": instance_id,
            "path": result[0],
            "offset": 0,
            "data": base64.b64encode(result[1]).decode(),
            "eof": True,
        }
        r = await q.call("POST", "/v1/dispatch/results", token="daemon", json_body=body)
        assert r.status == 200, r.body
