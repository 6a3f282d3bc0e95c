"""The queue API client, used by the CLI and by the daemon.

:class:`QueueClient` has one typed async method per route of ``nymph queue`` (see
``nymph/queue/openapi.yaml``). Failures raise :class:`QueueError` subclasses carrying the HTTP
status and the server's ``detail``; the token is never part of an error message or a log line.

Dispatch calls need a daemon session: the client registers with its token (the daemon bootstrap
token) on the first dispatch call, as the daemon identity the call names (or the ``daemon``
given at construction), and registers again when the identity changes or the queue answers
that the session lapsed or is unknown (a restarted queue), then retries the call once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json as jsonlib
from collections.abc import AsyncIterator, Mapping, Sequence
from types import TracebackType
from typing import Any, cast
from urllib.parse import quote

import aiohttp

from nymph.client.dispatch import DaemonIdentity, DispatchCalls
from nymph.client.errors import (
    BY_CODE,
    BY_STATUS,
    QueueAuthError,
    QueueBadRequest,
    QueueConflict,
    QueueError,
    QueueNotFound,
    QueueNotInstanceDaemon,
    QueueRegistrationRefused,
    QueueUnavailable,
    safe_url,
)
from nymph.protocol import (
    DaemonJSON,
    InstanceJSON,
    LaunchAccepted,
    TaskStatusJSON,
)

__all__ = [
    "DEFAULT_URL",
    "DaemonIdentity",
    "QueueAuthError",
    "QueueBadRequest",
    "QueueClient",
    "QueueConflict",
    "QueueError",
    "QueueNotFound",
    "QueueNotInstanceDaemon",
    "QueueRegistrationRefused",
    "QueueUnavailable",
    "safe_url",
]

DEFAULT_URL = "http://127.0.0.1:8700"


def _seg(value: str) -> str:
    return quote(value, safe="")


def _answer(*, method: str, path: str, where: str, status: int, raw: bytes) -> Any:
    """The decoded JSON body of a success, else the matching :class:`QueueError`."""
    body: Any = None
    if raw:
        try:
            body = jsonlib.loads(raw)
        except ValueError:
            body = None
    if status < 300:
        return body
    code = body.get("error") if isinstance(body, dict) else None
    detail = body.get("detail") if isinstance(body, dict) else None
    detail = str(detail) if detail else f"HTTP {status}"
    if status >= 500:
        raise QueueUnavailable(
            f"the queue at {where} failed on {method} {path}: {detail} (HTTP {status})",
            status=status,
            code=code,
            detail=detail,
        )
    by_code = BY_CODE.get(code) if isinstance(code, str) else None
    cls = by_code or BY_STATUS.get(status, QueueError)
    raise cls(f"{detail} (HTTP {status})", status=status, code=code, detail=detail)


class QueueClient(DispatchCalls):
    """Async client of the queue API. Use as ``async with QueueClient(...) as client:``."""

    def __init__(
        self,
        *,
        base_url: str = DEFAULT_URL,
        token: str | None = None,
        namespace: str = "default",
        timeout: float = 30.0,
        connect_timeout: float = 10.0,
        session: aiohttp.ClientSession | None = None,
        daemon: DaemonIdentity | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.namespace = namespace
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._token = token
        self._session = session
        self._own_session = session is None
        DispatchCalls.__init__(self, daemon=daemon)

    def __repr__(self) -> str:
        return f"QueueClient(base_url={safe_url(self.base_url)!r}, namespace={self.namespace!r})"

    async def __aenter__(self) -> QueueClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None and self._own_session:
            await self._session.close()
        self._session = None

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
            self._own_session = True
        return self._session

    def _ns(self, namespace: str | None) -> str:
        return f"/v1/namespaces/{_seg(namespace or self.namespace)}"

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        bearer: str | None = None,
    ) -> Any:
        """One call; returns the decoded JSON body (None for 204) or raises a QueueError.
        ``bearer`` replaces the client's token for this call (a daemon session)."""
        session = self._ensure_session()
        hdrs = dict(headers or {})
        credential = bearer or self._token
        if credential:
            hdrs["Authorization"] = f"Bearer {credential}"
        total = self.timeout if timeout is None else timeout
        client_timeout = aiohttp.ClientTimeout(total=total, connect=self.connect_timeout)
        where = safe_url(self.base_url)
        try:
            async with session.request(
                method, self.base_url + path, json=json, params=params, headers=hdrs, timeout=client_timeout
            ) as resp:
                status = resp.status
                raw = await resp.read()
        except aiohttp.ClientConnectorError:
            raise QueueUnavailable(
                f"cannot reach the queue at {where}: is `nymph queue serve` running?"
            ) from None
        except TimeoutError:
            raise QueueUnavailable(f"the queue at {where} did not answer within {total:g}s") from None
        except aiohttp.ClientError as exc:
            raise QueueUnavailable(
                f"lost the connection to the queue at {where} ({exc.__class__.__name__})"
            ) from None
        return _answer(method=method, path=path, where=where, status=status, raw=raw)

    @contextlib.asynccontextmanager
    async def stream(
        self, path: str, *, params: Mapping[str, str] | None = None, headers: Mapping[str, str] | None = None
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """A GET whose body is read as it arrives (no total timeout); errors as :meth:`request`."""
        session = self._ensure_session()
        hdrs = dict(headers or {})
        if self._token:
            hdrs["Authorization"] = f"Bearer {self._token}"
        client_timeout = aiohttp.ClientTimeout(total=None, connect=self.connect_timeout)
        where = safe_url(self.base_url)
        try:
            async with session.get(
                self.base_url + path, params=params, headers=hdrs, timeout=client_timeout
            ) as resp:
                if resp.status >= 300:
                    _answer(method="GET", path=path, where=where, status=resp.status, raw=await resp.read())
                yield resp
        except aiohttp.ClientConnectorError:
            raise QueueUnavailable(
                f"cannot reach the queue at {where}: is `nymph queue serve` running?"
            ) from None
        except aiohttp.ClientError as exc:
            raise QueueUnavailable(
                f"lost the connection to the queue at {where} ({exc.__class__.__name__})"
            ) from None

    # --- health ---------------------------------------------------------------------------

    async def healthz(self) -> dict[str, Any]:
        return cast(dict[str, Any], await self.request("GET", "/healthz"))

    async def openapi(self) -> str:
        session = self._ensure_session()
        try:
            async with session.get(self.base_url + "/openapi.yaml") as resp:
                return await resp.text()
        except aiohttp.ClientError:
            raise QueueUnavailable(
                f"cannot reach the queue at {safe_url(self.base_url)}: is `nymph queue serve` running?"
            ) from None

    # --- providers and modes --------------------------------------------------------------

    async def create_provider(
        self,
        *,
        name: str,
        kwargs: Mapping[str, Any],
        launcher: str = "Kube",
        dispatch: str | None = None,
        replace: bool = False,
        namespace: str | None = None,
    ) -> dict[str, Any]:
        """Create (or with ``replace``, replace) a provider; ``dispatch=None`` takes the queue's
        default (``direct``)."""
        body: dict[str, Any] = {"name": name, "launcher": launcher, "kwargs": dict(kwargs)}
        if dispatch is not None:
            body["dispatch"] = dispatch
        if replace:
            path = f"{self._ns(namespace)}/providers/{_seg(name)}"
            return cast(dict[str, Any], await self.request("PUT", path, json=body))
        return cast(dict[str, Any], await self.request("POST", f"{self._ns(namespace)}/providers", json=body))

    async def list_providers(self, *, namespace: str | None = None) -> list[dict[str, Any]]:
        body = await self.request("GET", f"{self._ns(namespace)}/providers")
        return cast(list[dict[str, Any]], body["items"])

    async def get_provider(self, *, name: str, namespace: str | None = None) -> dict[str, Any]:
        return cast(
            dict[str, Any], await self.request("GET", f"{self._ns(namespace)}/providers/{_seg(name)}")
        )

    async def delete_provider(self, *, name: str, namespace: str | None = None) -> None:
        await self.request("DELETE", f"{self._ns(namespace)}/providers/{_seg(name)}")

    async def create_mode(
        self,
        *,
        name: str,
        provider: str | None,
        fields: Mapping[str, Any],
        replace: bool = False,
        namespace: str | None = None,
    ) -> dict[str, Any]:
        body = {"name": name, "provider": provider, "fields": dict(fields)}
        if replace:
            path = f"{self._ns(namespace)}/modes/{_seg(name)}"
            return cast(dict[str, Any], await self.request("PUT", path, json=body))
        return cast(dict[str, Any], await self.request("POST", f"{self._ns(namespace)}/modes", json=body))

    async def list_modes(self, *, namespace: str | None = None) -> list[dict[str, Any]]:
        body = await self.request("GET", f"{self._ns(namespace)}/modes")
        return cast(list[dict[str, Any]], body["items"])

    async def get_mode(self, *, name: str, namespace: str | None = None) -> dict[str, Any]:
        return cast(dict[str, Any], await self.request("GET", f"{self._ns(namespace)}/modes/{_seg(name)}"))

    async def delete_mode(self, *, name: str, namespace: str | None = None) -> None:
        await self.request("DELETE", f"{self._ns(namespace)}/modes/{_seg(name)}")

    # --- launches and instances -----------------------------------------------------------

    async def launch(
        self,
        *,
        provider: str,
        mode: str,
        script: str,
        tags: Mapping[str, Any] | None = None,
        env: Mapping[str, Any] | None = None,
        fields: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        retries: int = 0,
        namespace: str | None = None,
    ) -> LaunchAccepted:
        """Queue a launch. With an ``idempotency_key``, ``retries`` re-sends it after a lost answer."""
        body: dict[str, Any] = {"mode": mode, "script": script}
        for key, value in (("tags", tags), ("env", env), ("fields", fields)):
            if value:
                body[key] = dict(value)
        path = f"{self._ns(namespace)}/providers/{_seg(provider)}/launch"
        return await self._post_launch(path, body, idempotency_key=idempotency_key, retries=retries)

    async def launch_dockyard(
        self,
        *,
        provider: str,
        recipe: Mapping[str, Any],
        infra: Mapping[str, Any] | None = None,
        overrides: Sequence[str] = (),
        idempotency_key: str | None = None,
        retries: int = 0,
        namespace: str | None = None,
    ) -> LaunchAccepted:
        """Queue a dockyard launch (recipe + infra, rendered and applied by a daemon). With an
        ``idempotency_key``, ``retries`` re-sends it after a lost answer."""
        body: dict[str, Any] = {"recipe": dict(recipe)}
        if infra:
            body["infra"] = dict(infra)
        if overrides:
            body["overrides"] = list(overrides)
        path = f"{self._ns(namespace)}/providers/{_seg(provider)}/dockyard"
        return await self._post_launch(path, body, idempotency_key=idempotency_key, retries=retries)

    async def _post_launch(
        self, path: str, body: dict[str, Any], *, idempotency_key: str | None, retries: int
    ) -> LaunchAccepted:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        attempt = 0
        while True:
            try:
                return cast(LaunchAccepted, await self.request("POST", path, json=body, headers=headers))
            except QueueUnavailable:
                attempt += 1
                if idempotency_key is None or attempt > retries:
                    raise
                await asyncio.sleep(min(5.0, 0.5 * 2**attempt))

    async def list_instances(
        self, *, provider: str, state: str | None = None, namespace: str | None = None
    ) -> list[InstanceJSON]:
        params = {"state": state} if state else None
        body = await self.request(
            "GET", f"{self._ns(namespace)}/providers/{_seg(provider)}/instances", params=params
        )
        return cast(list[InstanceJSON], body["items"])

    async def get_instance(
        self,
        *,
        provider: str,
        instance_id: str,
        after: int | None = None,
        wait: float | None = None,
        namespace: str | None = None,
    ) -> InstanceJSON:
        """The instance; with ``after`` and ``wait``, held until its version exceeds ``after``."""
        params: dict[str, str] = {}
        if after is not None:
            params["after"] = str(after)
        if wait is not None:
            params["wait"] = f"{wait:g}"
        path = f"{self._ns(namespace)}/providers/{_seg(provider)}/instances/{_seg(instance_id)}"
        timeout = self.timeout + (wait or 0.0)
        return cast(InstanceJSON, await self.request("GET", path, params=params or None, timeout=timeout))

    async def stop(
        self,
        *,
        provider: str,
        instance_id: str,
        grace_period_seconds: int | None = None,
        namespace: str | None = None,
    ) -> None:
        params = None if grace_period_seconds is None else {"gracePeriodSeconds": str(grace_period_seconds)}
        path = f"{self._ns(namespace)}/providers/{_seg(provider)}/instances/{_seg(instance_id)}"
        await self.request("DELETE", path, params=params)

    def logs_path(self, *, provider: str, instance_id: str, namespace: str | None = None) -> str:
        return f"{self._ns(namespace)}/providers/{_seg(provider)}/instances/{_seg(instance_id)}/logs"

    async def get_logs(self, *, provider: str, instance_id: str, namespace: str | None = None) -> str | None:
        body = await self.request(
            "GET", self.logs_path(provider=provider, instance_id=instance_id, namespace=namespace)
        )
        logs = body.get("logs")
        return None if logs is None else str(logs)

    async def test_provider(
        self, *, provider: str, mode: str | None = None, namespace: str | None = None
    ) -> str:
        """Queue a probe task; returns its task id (poll it with :meth:`get_task`)."""
        body = {"mode": mode} if mode else {}
        path = f"{self._ns(namespace)}/providers/{_seg(provider)}/test"
        return str((await self.request("POST", path, json=body))["taskId"])

    async def get_task(self, *, task_id: str, namespace: str | None = None) -> TaskStatusJSON:
        return cast(TaskStatusJSON, await self.request("GET", f"{self._ns(namespace)}/tasks/{_seg(task_id)}"))

    async def list_daemons(self, *, namespace: str | None = None) -> list[DaemonJSON]:
        body = await self.request("GET", f"{self._ns(namespace)}/daemons")
        return cast(list[DaemonJSON], body["items"])
