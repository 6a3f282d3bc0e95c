"""Following a container's log through the API server (kubernetes_asyncio, ``follow=true``,
``timestamps=true``, optionally from a ``sinceTime``).

:func:`open_log` opens the stream; :meth:`LogStream.read` returns the raw bytes as they arrive
and ``b""`` when the API server ends the stream (the container ended, or the connection was
closed). Errors are classified:
:class:`LogNotReady` (the container has not started yet: ask again later),
:class:`NoContainerLog` (the node serves no container logs at all, e.g. a kwok node without a
kubelet: do not ask again; :class:`NodeHasNoAddress` when the Node lists no address at all,
which holds for every Pod on it), or a :class:`nymph.kube.errors.KubeError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator

import aiohttp
from kubernetes_asyncio import client

from nymph.kube import rawcall
from nymph.kube.api import status_message
from nymph.kube.errors import KubeError, Unavailable, from_status

_NOT_READY = re.compile(
    r"waiting to start|ContainerCreating|PodInitializing|is not available|has not started", re.I
)
#: What the API server says when there is no kubelet (or no log endpoint) behind the node.
_NO_KUBELET = re.compile(
    r"no preferred addresses|dial tcp|connection refused|no route to host|i/o timeout|"
    r"the server could not find the requested resource|404 page not found|no such host",
    re.I,
)
#: What the API server says when the Node lists no address to reach its kubelet at.
_NO_ADDRESS = re.compile(r"no preferred addresses", re.I)
_READ_SIZE = 64 * 1024


class LogNotReady(KubeError):
    """The container has not started: its log cannot be read yet."""

    transient = True


class NoContainerLog(KubeError):
    """The node serves no container log (no kubelet behind it)."""


class NodeHasNoAddress(NoContainerLog):
    """The Node lists no address to reach a kubelet at: no Pod on it has a log to read (see
    :mod:`nymph.kube.loglessnodes`)."""


def classify(status: int, message: str, *, said: str | None = None) -> KubeError:
    """The error of a log answer: recognised on everything the server ``said`` (default:
    ``message``), carrying only ``message`` (what may be relayed: a Status message)."""
    seen = message if said is None else said
    if status == 400 and _NOT_READY.search(seen):
        return LogNotReady(message, status=status)
    if status in (400, 404, 500, 502, 503) and _NO_KUBELET.search(seen):
        node_wide = _NO_ADDRESS.search(seen) is not None
        return (NodeHasNoAddress if node_wide else NoContainerLog)(message, status=status)
    return from_status(status, message)


class LogStream:
    """An open log stream; :meth:`read` returns bytes, ``b""`` at its end, None on a timeout."""

    def __init__(self, resp: aiohttp.ClientResponse, *, where: str) -> None:
        self.resp = resp
        self.where = where

    async def read(self, *, timeout: float | None = None) -> bytes | None:
        try:
            async with asyncio.timeout(timeout):
                return await self.resp.content.read(_READ_SIZE)
        except TimeoutError:
            return None
        except (aiohttp.ClientError, OSError) as exc:
            raise Unavailable(f"the log stream of {self.where} broke: {exc.__class__.__name__}") from None


@contextlib.asynccontextmanager
async def open_log(
    api: client.ApiClient,
    *,
    namespace: str,
    name: str,
    container: str = "user",
    since_time: str | None = None,
    follow: bool = True,
) -> AsyncIterator[LogStream]:
    """The container's log (stamped lines) from ``since_time`` on, as it arrives (``follow``)
    or as the node has it now."""
    query: list[tuple[str, str]] = [
        ("container", container),
        ("follow", "true" if follow else "false"),
        ("timestamps", "true"),
    ]
    if since_time is not None:
        query.append(("sinceTime", since_time))
    try:
        # Sent raw: the generated client's request machinery cost more than the request.
        resp = await rawcall.send(
            api,
            "GET",
            rawcall.pod_path(namespace, name) + "/log",
            query=query,
            timeout=aiohttp.ClientTimeout(total=None, sock_read=None, connect=30),
            accept="*/*",
        )
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise Unavailable(f"cannot read the log of {namespace}/{name}: {exc.__class__.__name__}") from None
    try:
        if not 200 <= resp.status <= 299:
            try:
                body = (await resp.read()).decode("utf-8", errors="replace")
            except (aiohttp.ClientError, TimeoutError, OSError):
                body = ""
            said = f"{resp.reason or ''}: {body}"[:2000]
            raise classify(resp.status, status_message(resp.status, body), said=said)
        yield LogStream(resp, where=f"{namespace}/{name}")
    finally:
        resp.release()
