"""An API request with a body already encoded, through a kubernetes_asyncio client's own
session and credentials.

The generated client copies a request body recursively (``sanitize_for_serialization``) and
then encodes it with the standard library: for a Pod's manifest, the biggest part of a
create's cost on nymph's side. Here the manifest is encoded once (:func:`fastjson.dumps`) and
sent as it is; the headers, the credentials (a token the client refreshes included), the
server name and any proxy are the client's, as its own calls use them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
from kubernetes_asyncio import client

from nymph import fastjson

JSON = "application/json"


def pod_path(namespace: str, name: str | None = None) -> str:
    path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods"
    return path if name is None else f"{path}/{quote(name, safe='')}"


async def send(
    api: client.ApiClient,
    method: str,
    path: str,
    *,
    query: Sequence[tuple[str, str]] = (),
    body: Mapping[str, Any] | None = None,
    timeout: aiohttp.ClientTimeout | None = None,
    accept: str = JSON,
) -> aiohttp.ClientResponse:
    """Send ``method path?query`` with ``body`` as JSON; the response, unread (the caller reads
    and releases it). Errors are aiohttp's, as the generated client's are. No ``timeout``: none,
    as the generated client's calls without one."""
    headers: dict[str, str] = {**api.default_headers, "Accept": accept}
    if body is not None:
        headers["Content-Type"] = JSON
    if api.cookie:
        headers["Cookie"] = api.cookie
    queries: list[tuple[str, str]] = list(query)
    await api.update_params_for_auth(headers, queries, ["BearerToken"])
    url = f"{api.configuration.host}{path}"
    if queries:
        url += "?" + urlencode(queries)
    rest = api.rest_client
    # as the generated client's own requests go: its proxy and TLS server name, when set
    given = (
        ("proxy", rest.proxy),
        ("proxy_headers", rest.proxy_headers),
        ("server_hostname", rest.server_hostname),
    )
    extra: dict[str, Any] = {k: v for k, v in given if v}
    session: aiohttp.ClientSession = rest.pool_manager
    data = None if body is None else fastjson.dumps(body)
    return await session.request(
        method, url, data=data, headers=headers, timeout=timeout or aiohttp.ClientTimeout(), **extra
    )
