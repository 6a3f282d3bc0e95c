"""One Pod watch per namespace on the reserved labels, with a cache.

List, then watch from the list's resourceVersion; when a watch ends, resume from the last
resourceVersion seen; on ``410 Gone`` (or any error) relist and diff against the cache so that
no change, deletions included, is missed. Every change reaches ``on_event(type, pod)`` with
``type`` in ADDED / MODIFIED / DELETED and the pod as plain JSON.

With ``on_events`` instead, changes arrive in batches, in order: every change that came while
the handler was busy with the last batch (at most ``batch_max``), so a handler that writes each
change to a database commits many in one transaction under load, and one at a time when idle.
Either way the cache takes a change only once its handler returned: a handler that fails makes
the watch relist, which delivers the same differences again.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from nymph import fastjson
from nymph.kube.api import raw_json
from nymph.kube.errors import KubeError
from nymph.logsetup import get_logger

OnEvent = Callable[[str, dict[str, Any]], Awaitable[None]]
Change = tuple[str, dict[str, Any]]
OnEvents = Callable[[list[Change]], Awaitable[None]]

#: Most changes handed to ``on_events`` at once (and read ahead of a busy handler).
BATCH_MAX = 256


class _Gone(Exception):
    pass


@dataclass
class _End:
    """The end of a watch's stream, read ahead: how it ended (None: the server closed it)."""

    error: BaseException | None


def slim(pod: dict[str, Any]) -> dict[str, Any]:
    """Drop what nobody here reads and the cache would hold for every Pod: ``managedFields``
    (the field ownership of each apply and status update: a third of a launch Pod's JSON)."""
    meta = pod.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return pod


#: Where a watch event's ``managedFields`` start and end, as the API server writes a Pod: the
#: field is the last of ``ObjectMeta`` and the Pod's ``spec`` follows its ``metadata``. Inside a
#: JSON string every quote is escaped, so neither marker, each with bare quotes, can be found
#: in a string: only as the document's own syntax (the fields under ``managedFields`` are named
#: ``f:...``, never ``spec``).
_MANAGED_START = ',"managedFields":['
_MANAGED_END = ']},"spec":'


def without_managed_fields(data: str) -> str | None:
    """A watch event's JSON with its object's ``managedFields`` cut out before it is decoded
    (they are most of the small objects in a Pod's document, and :func:`slim` drops them
    anyway); None when ``data`` has not the layout the cut relies on."""
    start = data.find(_MANAGED_START)
    if start < 0:
        return None
    end = data.find(_MANAGED_END, start)
    if end < 0:
        return None
    return data[:start] + data[end + 1 :]


class RawWatch(watch.Watch):
    """A watch whose events stay plain JSON: the generated client would also build a V1Pod
    (and parse every timestamp) per event, which nobody here reads (a fifth of the daemon's
    CPU under a burst of launches)."""

    def get_return_type(self, func: object) -> str:
        return ""  # falsy: no model is built (the client checks ``if response_type``)

    def unmarshal_event(self, data: str | bytes, response_type: str | None) -> Any:
        """The event, as the client's own method gives it (``raw_object`` the object, and the
        watch's resourceVersion kept), decoded by :mod:`nymph.fastjson` without its
        ``managedFields`` (:func:`without_managed_fields`): a Pod's document at every change is
        most of what a watch costs. An error event, or anything not an event, goes to the
        client's method, which raises as it always has."""
        cut = without_managed_fields(data) if isinstance(data, str) else None
        try:
            js = fastjson.loads(data if cut is None else cut)
        except ValueError:
            if cut is None:
                return data
            try:  # not the layout the cut relies on after all: the whole event, as it came
                js = fastjson.loads(data)
            except ValueError:
                return data
        kind = js.get("type") if isinstance(js, dict) else None
        obj = js.get("object") if isinstance(js, dict) else None
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        if not isinstance(kind, str) or kind.lower() == "error" or not isinstance(meta, dict):
            return super().unmarshal_event(data, response_type)
        js["raw_object"] = obj
        if "resourceVersion" in meta:
            self.resource_version = meta["resourceVersion"]
        elif kind.lower() == "bookmark":
            return super().unmarshal_event(data, response_type)
        return js


class PodWatcher:
    def __init__(
        self,
        *,
        api: client.ApiClient,
        namespace: str,
        label_selector: str,
        on_event: OnEvent | None = None,
        on_events: OnEvents | None = None,
        on_restart: Callable[[str], None] | None = None,
        watch_timeout: int = 240,
        stall_margin: float = 30.0,
        batch_max: int = BATCH_MAX,
    ) -> None:
        if (on_event is None) == (on_events is None):
            raise ValueError("a PodWatcher takes on_event or on_events, one of them")
        self.api = api
        self.namespace = namespace
        self.selector = label_selector
        self.on_event = on_event
        self.on_events = on_events
        self.batch_max = max(1, batch_max)
        self.on_restart = on_restart
        self.watch_timeout = watch_timeout
        #: A watch the API server has not ended ``stall_margin`` seconds after it should have is
        #: taken for a dead connection (a half-open TCP stream says nothing): relist.
        self.stall_margin = stall_margin
        self.cache: dict[str, dict[str, Any]] = {}
        self._rv = ""
        self.synced = asyncio.Event()
        self.connected = False
        self.log = get_logger("watcher", namespace=namespace)

    async def run(self) -> None:
        backoff = 0.5
        while True:
            try:
                rv = await self._relist()
                backoff = 0.5
                while True:
                    rv = await self._watch(rv)
            except asyncio.CancelledError:
                raise
            except _Gone:
                self.log.info("watch expired (410 Gone); relisting")
                self._restarted("gone")
            except Exception as exc:
                self.connected = False
                self.log.warning("watch failed; relisting", error=f"{exc.__class__.__name__}: {exc}"[:300])
                self._restarted("error")
                await asyncio.sleep(backoff + random.uniform(0, backoff / 2))
                backoff = min(backoff * 2, 15.0)

    def _restarted(self, why: str) -> None:
        if self.on_restart:
            self.on_restart(why)

    async def _relist(self) -> str:
        v1 = client.CoreV1Api(self.api)
        # raw_json checks the status: a refused list (a 403 while a restarted API server's
        # authorizer warms up, a 500, a 429) is an error to retry, never an empty list, which
        # would report every Pod in the cache as deleted.
        data = await raw_json(
            v1.list_namespaced_pod(self.namespace, label_selector=self.selector, _preload_content=False)
        )
        if not isinstance(data.get("items"), list):
            raise KubeError(f"listing Pods in {self.namespace}: the answer was not a list")
        self.connected = True
        fresh = {p["metadata"]["name"]: slim(p) for p in data.get("items") or []}
        changes: list[Change] = []
        for name, pod in fresh.items():
            pod.setdefault("apiVersion", "v1")
            pod.setdefault("kind", "Pod")
            old = self.cache.get(name)
            if old is None or old["metadata"].get("resourceVersion") != pod["metadata"].get(
                "resourceVersion"
            ):
                changes.append(("ADDED" if old is None else "MODIFIED", pod))
        changes += [("DELETED", self.cache[name]) for name in self.cache if name not in fresh]
        for start in range(0, len(changes), self.batch_max):
            # The cache changes only once the handler has taken the change: if it fails, the
            # relist that follows sees the same difference and delivers it again.
            await self._handle(changes[start : start + self.batch_max])
        self.synced.set()
        return str(data["metadata"].get("resourceVersion") or "")

    async def _handle(self, changes: list[Change]) -> None:
        """Give ``changes`` to the handler, then to the cache (one at a time with ``on_event``)."""
        if self.on_events is not None:
            await self.on_events(changes)
            for kind, pod in changes:
                self._cached(kind, pod)
            return
        assert self.on_event is not None
        for kind, pod in changes:
            await self.on_event(kind, pod)
            self._cached(kind, pod)

    def _cached(self, kind: str, pod: dict[str, Any]) -> None:
        if kind == "DELETED":
            self.cache.pop(pod["metadata"]["name"], None)
        else:
            self.cache[pod["metadata"]["name"]] = pod

    async def _watch(self, rv: str) -> str:
        self._rv = rv
        if self.on_events is None:
            async with contextlib.aclosing(self._stream(rv)) as changes:
                async for change in changes:
                    await self._handle([change])
            return self._rv
        return await self._watch_in_batches(rv)

    async def _watch_in_batches(self, rv: str) -> str:
        """The stream read ahead by a task of its own while the handler works; each batch is
        every change read meanwhile (up to ``batch_max``: the reader waits for room)."""
        ahead: asyncio.Queue[Change | _End] = asyncio.Queue(self.batch_max)

        async def read() -> None:
            try:
                async with contextlib.aclosing(self._stream(rv)) as changes:
                    async for change in changes:
                        await ahead.put(change)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                await ahead.put(_End(exc))
                return
            await ahead.put(_End(None))

        reader = asyncio.create_task(read(), name=f"nymph-pod-watch-read-{self.namespace}")
        try:
            while True:
                item = await ahead.get()
                batch: list[Change] = []
                while not isinstance(item, _End):
                    batch.append(item)
                    if len(batch) >= self.batch_max or ahead.empty():
                        break
                    item = ahead.get_nowait()
                if batch:
                    await self._handle(batch)
                if isinstance(item, _End):
                    if item.error is not None:
                        raise item.error
                    return self._rv
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def _stream(self, rv: str) -> AsyncGenerator[Change, None]:
        """The changes after ``rv`` until the server ends the watch (``self._rv``: the last
        resourceVersion seen, bookmarks included)."""
        v1 = client.CoreV1Api(self.api)
        w = RawWatch()
        try:
            async with w:
                async for ev in w.stream(
                    v1.list_namespaced_pod,
                    namespace=self.namespace,
                    label_selector=self.selector,
                    resource_version=rv,
                    allow_watch_bookmarks=True,
                    timeout_seconds=self.watch_timeout,
                    _request_timeout=self.watch_timeout + self.stall_margin,
                ):
                    kind = ev.get("type")
                    obj = ev.get("raw_object") or {}
                    if kind == "ERROR":
                        if obj.get("code") == 410:
                            raise _Gone
                        raise RuntimeError(f"watch error: {obj.get('message')}")
                    new_rv = (obj.get("metadata") or {}).get("resourceVersion")
                    if new_rv:
                        self._rv = str(new_rv)
                    if kind == "BOOKMARK":
                        continue
                    yield str(kind), slim(obj)
        except ApiException as exc:
            if exc.status == 410:
                raise _Gone from None
            raise
