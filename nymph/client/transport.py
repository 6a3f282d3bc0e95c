"""How every queue call travels: one session, the token, one :meth:`Transport.request`, the
retry of an idempotent send, and the answer turned into a result or a :class:`QueueError`.

The token is never part of an error message or a log line; the URL in messages has no
credentials (:func:`safe_url`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json as jsonlib
from collections.abc import AsyncIterator, Iterator, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypedDict, cast
from urllib.parse import quote

from nymph import fastjson
from nymph.client import plainhttp
from nymph.client.errors import BY_CODE, BY_STATUS, QueueError, QueueUnavailable, safe_url
from nymph.netaddr import DEFAULT_URL as DEFAULT_URL

if TYPE_CHECKING:
    import aiohttp


def seg(value: str) -> str:
    """``value`` as one path segment of a route."""
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


def _unavailable(
    where: str, exc: BaseException, *, unreachable: bool, total: float | None
) -> QueueUnavailable:
    """The :class:`QueueUnavailable` for a failure to reach (``unreachable``) or hear the queue."""
    if unreachable:
        return QueueUnavailable(f"cannot reach the queue at {where}: is `nymph queue serve` running?")
    if isinstance(exc, TimeoutError) and total is not None:
        return QueueUnavailable(f"the queue at {where} did not answer within {total:g}s")
    return QueueUnavailable(f"lost the connection to the queue at {where} ({exc.__class__.__name__})")


@contextlib.contextmanager
def _reaching(where: str, *, total: float | None = None) -> Iterator[None]:
    """An aiohttp failure to reach or hear the queue as :class:`QueueUnavailable`; with ``total``
    (the call's whole timeout), a timeout says how long the call waited."""
    import aiohttp  # loaded already by whoever made the session

    try:
        yield
    except aiohttp.ClientConnectorError as exc:
        raise _unavailable(where, exc, unreachable=True, total=total) from None
    except (TimeoutError, aiohttp.ClientError) as exc:
        if isinstance(exc, TimeoutError) and total is None:
            raise
        raise _unavailable(where, exc, unreachable=False, total=total) from None


class TransportOptions(TypedDict, total=False):
    """The keywords of :class:`Transport`, which every client takes."""

    base_url: str
    token: str | None
    namespace: str
    timeout: float
    connect_timeout: float
    session: aiohttp.ClientSession | None
    light: bool


class Transport:
    """The connection to one queue. Use as ``async with Client(...) as client:``.

    ``light=True`` (what the CLI passes) sends plain calls through the standard library
    (:mod:`nymph.client.plainhttp`), so a command that lists or launches never imports aiohttp;
    streams (a log followed, a file downloaded) still use an aiohttp session.
    """

    def __init__(
        self,
        *,
        base_url: str = DEFAULT_URL,
        token: str | None = None,
        namespace: str = "default",
        timeout: float = 30.0,
        connect_timeout: float = 10.0,
        session: aiohttp.ClientSession | None = None,
        light: bool = False,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.namespace = namespace
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._token = token
        self._session = session
        self._own_session = session is None
        self._light = light and session is None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={safe_url(self.base_url)!r}, namespace={self.namespace!r})"

    async def __aenter__(self) -> Self:
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
            import aiohttp

            # requests' JSON bodies (a daemon's claims, reports and completions) by orjson
            self._session = aiohttp.ClientSession(json_serialize=fastjson.dumps_text)
            self._own_session = True
        return self._session

    def _ns(self, namespace: str | None) -> str:
        return f"/v1/namespaces/{seg(namespace or self.namespace)}"

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
        hdrs = dict(headers or {})
        credential = bearer or self._token
        if credential:
            hdrs["Authorization"] = f"Bearer {credential}"
        total = self.timeout if timeout is None else timeout
        where = safe_url(self.base_url)
        if self._light:
            try:
                answer = await plainhttp.detached(
                    functools.partial(
                        plainhttp.exchange,
                        method,
                        self.base_url + path,
                        json=json,
                        params=params,
                        headers=hdrs,
                        timeout=total,
                        connect_timeout=min(self.connect_timeout, total),
                    )
                )
            except plainhttp.Unreachable as exc:
                raise _unavailable(where, exc, unreachable=True, total=total) from None
            except (TimeoutError, plainhttp.Lost) as exc:
                raise _unavailable(where, exc, unreachable=False, total=total) from None
            return _answer(method=method, path=path, where=where, status=answer.status, raw=answer.body)
        import aiohttp

        session = self._ensure_session()
        client_timeout = aiohttp.ClientTimeout(total=total, connect=self.connect_timeout)
        with _reaching(where, total=total):
            async with session.request(
                method, self.base_url + path, json=json, params=params, headers=hdrs, timeout=client_timeout
            ) as resp:
                status = resp.status
                raw = await resp.read()
        return _answer(method=method, path=path, where=where, status=status, raw=raw)

    async def send_once(
        self, path: str, body: dict[str, Any], *, idempotency_key: str | None, retries: int
    ) -> Any:
        """POST ``body`` with an ``Idempotency-Key``: the queue acts on it once however often it
        arrives, so a lost answer is re-sent up to ``retries`` times (never without a key)."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        attempt = 0
        while True:
            try:
                return await self.request("POST", path, json=body, headers=headers)
            except QueueUnavailable:
                attempt += 1
                if idempotency_key is None or attempt > retries:
                    raise
                await asyncio.sleep(min(5.0, 0.5 * 2**attempt))

    @contextlib.asynccontextmanager
    async def stream(
        self, path: str, *, params: Mapping[str, str] | None = None, headers: Mapping[str, str] | None = None
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """A GET whose body is read as it arrives (no total timeout); errors as :meth:`request`."""
        import aiohttp

        session = self._ensure_session()
        hdrs = dict(headers or {})
        if self._token:
            hdrs["Authorization"] = f"Bearer {self._token}"
        client_timeout = aiohttp.ClientTimeout(total=None, connect=self.connect_timeout)
        where = safe_url(self.base_url)
        with _reaching(where):
            async with session.get(
                self.base_url + path, params=params, headers=hdrs, timeout=client_timeout
            ) as resp:
                if resp.status >= 300:
                    _answer(method="GET", path=path, where=where, status=resp.status, raw=await resp.read())
                yield resp

    # --- the routes every audience has ------------------------------------------------------

    async def healthz(self) -> dict[str, Any]:
        return cast(dict[str, Any], await self.request("GET", "/healthz"))

    async def openapi(self) -> str:
        import aiohttp

        session = self._ensure_session()
        try:
            async with session.get(self.base_url + "/openapi.yaml") as resp:
                return await resp.text()
        except aiohttp.ClientError:
            raise QueueUnavailable(
                f"cannot reach the queue at {safe_url(self.base_url)}: is `nymph queue serve` running?"
            ) from None
