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
import json as jsonlib
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any, cast
from urllib.parse import quote

import aiohttp

from nymph.client_errors import (
    BY_STATUS,
    QueueAuthError,
    QueueBadRequest,
    QueueConflict,
    QueueError,
    QueueNotFound,
    QueueUnavailable,
    safe_url,
)
from nymph.protocol import (
    ActiveJSON,
    CompleteAnswer,
    DaemonJSON,
    InstanceJSON,
    LaunchAccepted,
    RenewAnswer,
    ReportAck,
    SessionJSON,
    TaskJSON,
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
    "QueueUnavailable",
    "safe_url",
]

DEFAULT_URL = "http://127.0.0.1:8700"
#: Answers (401 codes) after which the client registers again and retries the call once.
SESSION_LOST_CODES = frozenset({"session_expired", "unknown_session", "session_required"})


@dataclass(frozen=True)
class DaemonIdentity:
    """Who a daemon registers as: its id, its node ("" if unknown) and the kube namespaces it
    serves (empty: every namespace)."""

    daemon_id: str
    node: str = ""
    namespaces: tuple[str, ...] = ()


def _seg(value: str) -> str:
    return quote(value, safe="")


class QueueClient:
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
        #: The identity dispatch calls register as (learned from claims when not given).
        self.daemon = daemon
        self._registered: DaemonIdentity | None = None
        self._session_token: str | None = None
        self._register_lock = asyncio.Lock()

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
        cls = BY_STATUS.get(status, QueueError)
        raise cls(f"{detail} (HTTP {status})", status=status, code=code, detail=detail)

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
        dispatch: str = "daemon",
        replace: bool = False,
        namespace: str | None = None,
    ) -> dict[str, Any]:
        body = {"name": name, "launcher": launcher, "kwargs": dict(kwargs), "dispatch": dispatch}
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

    async def get_logs(self, *, provider: str, instance_id: str, namespace: str | None = None) -> str | None:
        path = f"{self._ns(namespace)}/providers/{_seg(provider)}/instances/{_seg(instance_id)}/logs"
        body = await self.request("GET", path)
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

    # --- dispatch (daemon sessions) ----------------------------------------------------------

    async def register(self, *, identity: DaemonIdentity) -> SessionJSON:
        """Register ``identity`` with the client's (bootstrap) token; later dispatch calls use
        the session credential it returns."""
        body = {
            "daemonId": identity.daemon_id,
            "node": identity.node,
            "namespaces": list(identity.namespaces),
        }
        answer = cast(SessionJSON, await self.request("POST", "/v1/dispatch/register", json=body))
        self._session_token = answer["sessionToken"]
        self._registered = identity
        return answer

    def _identity(
        self, *, daemon_id: str | None, node: str | None = None, namespaces: Sequence[str] | None = None
    ) -> DaemonIdentity:
        """The identity a dispatch call acts as: the one given or learned, with what the call names."""
        base = self.daemon or self._registered
        if base is None:
            base = DaemonIdentity(daemon_id=daemon_id or f"{node or 'daemon'}-{secrets.token_hex(4)}")
        changes: dict[str, Any] = {}
        if daemon_id is not None:
            changes["daemon_id"] = daemon_id
        if node is not None:
            changes["node"] = node
        if namespaces is not None:
            changes["namespaces"] = tuple(namespaces)
        return replace(base, **changes)

    async def _session_for(self, identity: DaemonIdentity, *, stale: str | None = None) -> str:
        async with self._register_lock:
            if (
                self._session_token is None
                or self._registered != identity
                or (stale is not None and self._session_token == stale)
            ):
                await self.register(identity=identity)
            assert self._session_token is not None
            return self._session_token

    async def _dispatch(
        self,
        method: str,
        path: str,
        *,
        identity: DaemonIdentity,
        json: Any = None,
        params: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> Any:
        credential = await self._session_for(identity)
        try:
            return await self.request(
                method, path, json=json, params=params, timeout=timeout, bearer=credential
            )
        except QueueAuthError as exc:
            if exc.status != 401 or exc.code not in SESSION_LOST_CODES:
                raise
        credential = await self._session_for(identity, stale=credential)
        return await self.request(method, path, json=json, params=params, timeout=timeout, bearer=credential)

    async def claim(
        self,
        *,
        daemon_id: str,
        node: str,
        namespaces: Sequence[str] = (),
        capacity: int,
        wait: float = 30.0,
        lease_seconds: int | None = None,
    ) -> list[TaskJSON]:
        identity = self._identity(daemon_id=daemon_id, node=node, namespaces=namespaces)
        body: dict[str, Any] = {
            "daemonId": daemon_id,
            "node": node,
            "namespaces": list(namespaces),
            "capacity": capacity,
            "wait": wait,
        }
        if lease_seconds is not None:
            body["leaseSeconds"] = lease_seconds
        answer = await self._dispatch(
            "POST", "/v1/dispatch/claim", identity=identity, json=body, timeout=self.timeout + wait
        )
        return cast(list[TaskJSON], answer["tasks"])

    async def renew(
        self, *, daemon_id: str, task_ids: Sequence[str], lease_seconds: int | None = None
    ) -> RenewAnswer:
        body: dict[str, Any] = {"daemonId": daemon_id, "taskIds": list(task_ids)}
        if lease_seconds is not None:
            body["leaseSeconds"] = lease_seconds
        identity = self._identity(daemon_id=daemon_id)
        return cast(
            RenewAnswer, await self._dispatch("POST", "/v1/dispatch/renew", identity=identity, json=body)
        )

    async def release(self, *, daemon_id: str, task_ids: Sequence[str]) -> list[str]:
        body = {"daemonId": daemon_id, "taskIds": list(task_ids)}
        identity = self._identity(daemon_id=daemon_id)
        answer = await self._dispatch("POST", "/v1/dispatch/release", identity=identity, json=body)
        return cast(list[str], answer["released"])

    async def complete(
        self,
        *,
        daemon_id: str,
        task_id: str,
        ok: bool,
        error: str | None = None,
        retryable: bool = False,
        result: Mapping[str, Any] | None = None,
    ) -> CompleteAnswer:
        body: dict[str, Any] = {"daemonId": daemon_id, "taskId": task_id, "ok": ok, "retryable": retryable}
        if error is not None:
            body["error"] = error
        if result is not None:
            body["result"] = dict(result)
        identity = self._identity(daemon_id=daemon_id)
        return cast(
            CompleteAnswer,
            await self._dispatch("POST", "/v1/dispatch/complete", identity=identity, json=body),
        )

    async def report(self, *, daemon_id: str, stream: str, reports: Sequence[Mapping[str, Any]]) -> ReportAck:
        """Send reports (each shaped as :class:`nymph.protocol.ReportJSON`)."""
        body = {"daemonId": daemon_id, "stream": stream, "reports": [dict(r) for r in reports]}
        identity = self._identity(daemon_id=daemon_id)
        return cast(
            ReportAck, await self._dispatch("POST", "/v1/dispatch/report", identity=identity, json=body)
        )

    async def upload_logs(self, *, daemon_id: str, instance_id: str, logs: str) -> None:
        body = {"daemonId": daemon_id, "instanceId": instance_id, "logs": logs}
        await self._dispatch(
            "POST", "/v1/dispatch/logs", identity=self._identity(daemon_id=daemon_id), json=body
        )

    async def active(self, *, node: str) -> list[ActiveJSON]:
        identity = self._identity(daemon_id=None, node=node)
        body = await self._dispatch("GET", "/v1/dispatch/active", identity=identity, params={"node": node})
        return cast(list[ActiveJSON], body["items"])
