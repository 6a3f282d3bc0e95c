"""Live logs of direct launches: the queue follows each Pod's ``user`` container log itself,
with the provider's connection, and stores it as the daemon path does (chunks by offset, see
:mod:`nymph.queue.sql.logchunks`).

The Pod watch hands every event here (:meth:`DirectLogs.on_pod`); a follower starts once the
container has started and ends when its log is complete. The resume cursor is the one kept with
the stored log, so a queue restart goes on where the log stopped (the watch's first list
starts the followers again). The reaper leaves a Pod alone while its log is being followed
(:meth:`DirectLogs.busy`). A node that lists no address serves no log: once one Pod on it was
answered so, the others on it are not asked for a while (:mod:`nymph.kube.loglessnodes`, keyed
by the connection and the node, as two clusters may name their nodes alike).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from typing import Any

import structlog

from nymph.kube.logfollow import FollowSettings, follow_container_log
from nymph.kube.loglessnodes import LoglessNodes
from nymph.kube.pods import Connection
from nymph.launch.logcursor import Cursor
from nymph.launch.state import container_started, container_termination
from nymph.queue.direct.connect import Connector
from nymph.queue.store import Store

log = structlog.get_logger(__name__, component="queue.direct.logs")


class DirectLogs:
    def __init__(self, *, store: Store, connector: Connector, settings: FollowSettings | None = None) -> None:
        self.store = store
        self.connector = connector
        self.settings = settings or FollowSettings()
        self.tasks: dict[str, asyncio.Task[None]] = {}
        #: The last state of each followed Pod (None: deleted), for "has the container ended".
        self.pods: dict[str, dict[str, Any] | None] = {}
        self.logless = LoglessNodes()

    def busy(self, instance_id: str) -> bool:
        return instance_id in self.tasks

    def serves_no_log(self, conn: Connection, node: str) -> bool:
        """Whether ``node`` of that cluster answered a follower that it serves no log, lately:
        a tail read of a Pod on it would be refused the same way."""
        return self.logless.known(_node_key(conn, node)) is not None

    async def on_pod(self, *, ns: str, conn: Connection, kind: str, pod: dict[str, Any]) -> None:
        name = str((pod.get("metadata") or {}).get("name") or "")
        if not name:
            return
        if name in self.tasks:
            self.pods[name] = None if kind == "DELETED" else pod
            return
        if kind == "DELETED" or not container_started(pod):
            return
        if not await self.store.direct.is_direct(instance_id=name):
            return  # a daemon-path Pod with the same labels: its daemon follows it
        self.pods[name] = pod
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        task = asyncio.create_task(self._run(ns, conn, name, node), name=f"nymph-direct-logs-{name}")
        self.tasks[name] = task
        task.add_done_callback(functools.partial(self._done, name))

    def _done(self, name: str, task: asyncio.Task[None]) -> None:
        self.tasks.pop(name, None)
        self.pods.pop(name, None)
        if not task.cancelled() and task.exception() is not None:
            log.warning("log follower failed", instance=name, error=repr(task.exception())[:300])

    def _ended(self, name: str) -> bool:
        pod = self.pods.get(name)
        return pod is None or container_termination(pod) is not None

    async def _run(self, ns: str, conn: Connection, name: str, node: str) -> None:
        st = await self.store.output.status(instance_id=name)
        if st is not None and st.complete:
            return
        cursor = Cursor.load(st.cursor if st is not None else None)
        async with self.connector.api(ns=ns, conn=conn, what=f"following the log of {name}") as api:
            await follow_container_log(
                api,
                namespace=conn.namespace,
                name=name,
                cursor=cursor,
                sink=_StoreSink(self.store, name),
                ended=lambda: self._ended(name),
                settings=self.settings,
                node=_node_key(conn, node) if node else "",
                logless=self.logless,
            )

    async def close(self) -> None:
        tasks = list(self.tasks.values())
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t


def _node_key(conn: Connection, node: str) -> str:
    """A node, by cluster: two clusters may name their nodes alike."""
    return f"{conn.key()}\0{node}"


class _StoreSink:
    def __init__(self, store: Store, name: str) -> None:
        self.store = store
        self.name = name

    async def room(self) -> None:
        return None  # each chunk is written before the next is read

    async def ship(self, *, offset: int, data: bytes, cursor: Cursor, final: bool, note: str | None) -> None:
        await self.store.output.append(
            instance_id=self.name, offset=offset, data=data, cursor=cursor.dump(), final=final, note=note
        )
