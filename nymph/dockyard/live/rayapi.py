"""A small client of the Ray Jobs REST API of a head's dashboard (aiohttp; no ``ray``).

``POST /api/jobs/`` submits, ``GET /api/jobs/`` lists, ``GET /api/jobs/{id}`` reads one,
``GET /api/jobs/{id}/logs`` returns the driver log, ``GET /api/jobs/{id}/logs/tail`` streams
it over a websocket, ``POST /api/jobs/{id}/stop`` stops; ``GET|PUT /api/packages/gcs/NAME``
checks for / uploads a working-dir package. Every failure becomes one
:class:`DockyardLiveError` line naming the address.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import aiohttp

from nymph.dockyard.errors import DockyardLiveError
from nymph.dockyard.live.status import TERMINAL_JOB

JobInfo = dict[str, Any]


def normalize_address(address: str) -> str:
    """``host:port`` or ``http(s)://host:port[/]`` -> ``http(s)://host:port``."""
    text = address.strip().rstrip("/")
    if not text:
        raise DockyardLiveError("--ray-address is empty (give http://HOST:8265)")
    if "://" not in text:
        text = f"http://{text}"
    if not text.startswith(("http://", "https://")):
        raise DockyardLiveError(
            f"--ray-address {address!r}: use the dashboard's http://HOST:PORT (the Jobs REST API), "
            "not a ray:// client address"
        )
    return text


def _last_line(text: str) -> str:
    """The telling line of an error body: the last ``...Error: ...`` line of a traceback,
    else the last line with any word in it."""
    lines = [ln.strip() for ln in text.strip().splitlines() if any(c.isalnum() for c in ln)]
    errors = [ln for ln in lines if re.match(r"^[\w.]*(Error|Exception)\b.*: ", ln)]
    chosen = errors[-1] if errors else (lines[-1] if lines else "")
    return chosen[:300]


@dataclass
class RayJobsClient:
    address: str
    timeout: float = 30.0
    _session: aiohttp.ClientSession | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.address = normalize_address(self.address)

    async def __aenter__(self) -> RayJobsClient:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("RayJobsClient used outside 'async with'")
        return self._session

    async def _request(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        data: bytes | None = None,
        what: str,
    ) -> tuple[int, str]:
        url = f"{self.address}{path}"
        try:
            async with self.session.request(method, url, json=body, data=data) as resp:
                return resp.status, await resp.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise DockyardLiveError(
                f"{what}: cannot reach the Ray dashboard at {self.address} ({exc.__class__.__name__}: "
                f"{str(exc)[:200]}); is the head running and the address right?"
            ) from None

    async def _json(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        what: str,
        not_found: str | None = None,
    ) -> Any:
        status, text = await self._request(method, path, body=body, what=what)
        if status == 404 and not_found is not None:
            raise DockyardLiveError(not_found)
        if status >= 400:
            raise DockyardLiveError(
                f"{what}: the Ray dashboard at {self.address} answered HTTP {status}: "
                f"{_last_line(text) or 'no detail'}"
            )
        try:
            return json.loads(text) if text.strip() else None
        except ValueError:
            raise DockyardLiveError(
                f"{what}: {self.address} did not answer JSON (is it a Ray dashboard?)"
            ) from None

    def _missing(self, job_id: str) -> str:
        return f"no Ray job {job_id!r} on {self.address} (list them with: nymph dockyard job list)"

    async def version(self) -> Mapping[str, Any]:
        doc = await self._json("GET", "/api/version", what="Ray version")
        if not isinstance(doc, dict):
            raise DockyardLiveError(f"{self.address}/api/version did not answer a JSON object")
        return doc

    async def submit(
        self,
        *,
        entrypoint: str,
        submission_id: str | None = None,
        runtime_env: Mapping[str, Any] | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> str:
        body: dict[str, Any] = {"entrypoint": entrypoint}
        if submission_id:
            body["submission_id"] = submission_id
        if runtime_env:
            body["runtime_env"] = dict(runtime_env)
        if metadata:
            body["metadata"] = dict(metadata)
        doc = await self._json("POST", "/api/jobs/", body=body, what="submit")
        job_id = (doc or {}).get("submission_id") or (doc or {}).get("job_id")
        if not isinstance(job_id, str) or not job_id:
            raise DockyardLiveError(f"submit: {self.address} answered no submission id")
        return job_id

    async def jobs(self) -> list[JobInfo]:
        doc = await self._json("GET", "/api/jobs/", what="list jobs")
        if not isinstance(doc, list):
            raise DockyardLiveError(f"list jobs: {self.address} did not answer a list")
        return [j for j in doc if isinstance(j, dict)]

    async def info(self, job_id: str) -> JobInfo:
        doc = await self._json("GET", f"/api/jobs/{job_id}", what="job info", not_found=self._missing(job_id))
        if not isinstance(doc, dict):
            raise DockyardLiveError(f"job info: {self.address} did not answer an object")
        return doc

    async def logs(self, job_id: str) -> str:
        doc = await self._json(
            "GET", f"/api/jobs/{job_id}/logs", what="job logs", not_found=self._missing(job_id)
        )
        return str((doc or {}).get("logs") or "")

    async def stop(self, job_id: str) -> bool:
        doc = await self._json(
            "POST", f"/api/jobs/{job_id}/stop", what="stop job", not_found=self._missing(job_id)
        )
        return bool((doc or {}).get("stopped"))

    async def upload_package(self, uri: str, data: bytes) -> bool:
        """Upload a ``gcs://_ray_pkg_*.zip`` package unless the head has it; True if uploaded."""
        protocol, _, name = uri.partition("://")
        path = f"/api/packages/{protocol}/{name}"
        status, text = await self._request("GET", path, what="check the working-dir package")
        if status == 200:
            return False
        if status != 404:
            raise DockyardLiveError(
                f"check the working-dir package: {self.address} answered HTTP {status}: {_last_line(text)}"
            )
        status, text = await self._request("PUT", path, data=data, what="upload the working dir")
        if status != 200:
            raise DockyardLiveError(
                f"upload the working dir: {self.address} answered HTTP {status}: "
                f"{_last_line(text) or 'no detail'}"
            )
        return True

    async def running(self) -> list[JobInfo]:
        """The jobs that are not finished (PENDING, RUNNING)."""
        return [j for j in await self.jobs() if str(j.get("status") or "") not in TERMINAL_JOB]

    async def tail(self, job_id: str) -> AsyncIterator[str]:
        """The driver log as it grows, until the job ends (the dashboard closes the socket)."""
        info = await self.info(job_id)  # a clear error for an unknown id
        if info.get("status") in TERMINAL_JOB:  # nothing more will come: the whole log at once
            yield await self.logs(job_id)
            return
        url = f"{self.address}/api/jobs/{job_id}/logs/tail"
        try:
            async with self.session.ws_connect(url, timeout=aiohttp.ClientWSTimeout(ws_close=10)) as ws:
                async for msg in ws:
                    if msg.type is aiohttp.WSMsgType.TEXT:
                        yield str(msg.data)
                    elif msg.type in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                        break
        except aiohttp.ClientError as exc:
            raise DockyardLiveError(
                f"job logs -f: cannot stream from {self.address} ({exc.__class__.__name__}); try without -f"
            ) from None

    async def wait_ready(self, *, deadline: float, interval: float = 1.0) -> Mapping[str, Any]:
        """Poll ``/api/version`` until the dashboard answers or ``deadline`` (monotonic)."""
        while True:
            try:
                return await self.version()
            except DockyardLiveError:
                if time.monotonic() >= deadline:
                    raise
            await asyncio.sleep(interval)

    async def follow(
        self,
        job_id: str,
        *,
        on_change: Callable[[JobInfo], None],
        interval: float = 2.0,
        deadline: float | None = None,
    ) -> JobInfo:
        """Poll a job until it is terminal, calling ``on_change`` at each status change."""
        last: str | None = None
        while True:
            info = await self.info(job_id)
            status = str(info.get("status") or "")
            if status != last:
                on_change(info)
                last = status
            if status in TERMINAL_JOB:
                return info
            if deadline is not None and time.monotonic() >= deadline:
                raise DockyardLiveError(
                    f"Ray job {job_id} still {status} at the --timeout; it keeps running "
                    f"(follow it with: nymph dockyard job logs {job_id} -f)"
                )
            await asyncio.sleep(interval)
