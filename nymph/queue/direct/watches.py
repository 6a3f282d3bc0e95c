"""One Pod watch per distinct (control-plane namespace, connection), started on demand and
stopped when idle, feeding the queue's history so ``launch --wait``, ``instances`` and the
per-instance long-poll behave as on the daemon path."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from nymph.kube.pods import Connection
from nymph.kube.watch import PodWatcher
from nymph.launch.names import LABEL_MANAGED, LABEL_NAMESPACE, label_selector
from nymph.protocol import now
from nymph.queue.direct.connect import Connector
from nymph.queue.direct.settings import DirectSettings
from nymph.queue.store import Store

log = structlog.get_logger(__name__, component="queue.direct.watches")

WatchKey = tuple[str, str]


class OnPod(Protocol):
    async def __call__(self, *, ns: str, conn: Connection, kind: str, pod: dict[str, Any]) -> None: ...


@dataclass
class _Watch:
    task: asyncio.Task[None]
    idle_since: float | None = None
    events: int = field(default=0)


class WatchManager:
    def __init__(
        self,
        *,
        store: Store,
        connector: Connector,
        settings: DirectSettings,
        on_pod: OnPod | None = None,
    ) -> None:
        self.store = store
        self.connector = connector
        self.settings = settings
        self.watches: dict[WatchKey, _Watch] = {}
        #: Also told of every Pod event (the live log followers).
        self.on_pod = on_pod
        #: False on a replica that does not run the watches (another holds the lock): a launch
        #: there starts none; the running replica's next tick picks the new instance up.
        self.active = True

    @staticmethod
    def key(*, ns: str, connection: dict[str, Any]) -> WatchKey:
        return ns, Connection.from_json(connection).key()

    def ensure(self, *, ns: str, connection: dict[str, Any]) -> None:
        """Start the watch of this connection unless it runs already (or watches run elsewhere)."""
        if not self.active:
            return
        key = self.key(ns=ns, connection=connection)
        current = self.watches.get(key)
        if current is not None and not current.task.done():
            current.idle_since = None
            return
        conn = Connection.from_json(connection)
        task = asyncio.create_task(self._run(ns, conn), name=f"nymph-direct-watch-{ns}-{conn.namespace}")
        self.watches[key] = _Watch(task=task)
        log.info("watch started", namespace=ns, connection=conn.describe())

    async def _run(self, ns: str, conn: Connection) -> None:
        selector = label_selector({LABEL_MANAGED: "true", LABEL_NAMESPACE: ns})

        async def on_events(changes: list[tuple[str, dict[str, Any]]]) -> None:
            # Every change that came while the last batch was written goes in one transaction.
            for iid in await self.store.direct.apply_pods(ns=ns, changes=changes, ts=now()):
                self.store.instance_changed.notify(iid)
            if self.on_pod is not None:
                for kind, pod in changes:
                    await self.on_pod(ns=ns, conn=conn, kind=kind, pod=pod)

        backoff = 0.5
        while True:
            try:
                async with self.connector.api(ns=ns, conn=conn, what="watching Pods") as api:
                    backoff = 0.5
                    await PodWatcher(
                        api=api, namespace=conn.namespace, label_selector=selector, on_events=on_events
                    ).run()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                detail = getattr(exc, "detail", None) or exc.__class__.__name__
                log.warning(
                    "watch cannot start; retrying", namespace=ns, connection=conn.describe(), error=detail
                )
            await asyncio.sleep(backoff + random.uniform(0, backoff / 2))
            backoff = min(backoff * 2, 30.0)

    async def tick(self) -> None:
        """Start the watches recorded instances need; stop those idle for ``watch_idle``."""
        needed = {
            (ns, Connection.from_json(json.loads(c)).key()): (ns, json.loads(c))
            for ns, c in await self.store.direct.watched()
        }
        for ns, data in needed.values():
            self.ensure(ns=ns, connection=data)
        t = asyncio.get_running_loop().time()
        for key, w in list(self.watches.items()):
            if key in needed:
                w.idle_since = None
                continue
            if w.idle_since is None:
                w.idle_since = t
            elif t - w.idle_since >= self.settings.watch_idle:
                await self._stop(key)
        await self.connector.sweep()

    async def _stop(self, key: WatchKey) -> None:
        w = self.watches.pop(key)
        w.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await w.task
        log.info("watch stopped (idle)", namespace=key[0])

    async def run(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception:
                log.exception("watch bookkeeping failed; retrying")
            await asyncio.sleep(self.settings.interval)

    async def close(self) -> None:
        for key in list(self.watches):
            await self._stop(key)
