"""Live logs: for every Pod of its own whose ``user`` container started, the daemon follows the
container's log and ships it to the queue in ordered chunks through the outbox.

One task per Pod (:class:`LogFollowers`). A follower keeps a cursor (bytes shipped, the stamp of
the last shipped line and how many lines had it; :mod:`nymph.launch.logcursor`) in the mark book
``<state>/logs.marks`` (:mod:`nymph.daemon.marks`), written after each chunk is in the outbox; a dropped
stream or a daemon restart resumes from it, and the overlap is dropped here (by stamp) or at the
queue (by offset). Memory is bounded: at most ``chunk_bytes`` are buffered, and a follower waits
for room in the outbox before it reads on (the API server and the node hold the rest). When the
container has ended and its log is read to the end, the last chunk is ``final``; only then (or
when there is no log to read) does :meth:`LogFollowers.settled` let the reaper delete the Pod. A
node that serves no container logs (kwok: no kubelet) is noticed on the first answer and the
follower stops with a note, without retrying; when the node lists no address at all, the
followers of the next Pods stop with the same note without asking, for a while
(:mod:`nymph.kube.loglessnodes`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from nymph.daemon.marks import MarkBook
from nymph.daemon.outbox import Outbox
from nymph.daemon.tracker import Tracker
from nymph.kube.logfollow import FollowSettings, follow_container_log
from nymph.kube.loglessnodes import LoglessNodes
from nymph.launch.logcursor import Cursor
from nymph.launch.state import container_started, container_termination
from nymph.logsetup import get_logger


class LogFollowers:
    def __init__(
        self,
        *,
        api: client.ApiClient,
        outbox: Outbox,
        tracker: Tracker,
        state_dir: Path,
        settings: FollowSettings | None = None,
        on_gap: Callable[[str, str], None] | None = None,
    ) -> None:
        self.api = api
        #: Told (instance, namespace) when the node rotated unread lines away (the audit log).
        self.on_gap = on_gap or (lambda _name, _ns: None)
        self.outbox = outbox
        self.tracker = tracker
        self.cursors = MarkBook(state_dir / "logs.marks")
        # A daemon of an earlier version kept one file per Pod: <state>/logs/<instance>.json.
        self.cursors.adopt(state_dir / "logs", _legacy_cursor)
        self.settings = settings or FollowSettings()
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.deleted: set[str] = set()
        #: This node, when it lists no address: its Pods are not each asked for a log.
        self.logless = LoglessNodes()
        self.log = get_logger("logs")

    # -- the watch's callback and the reaper's question -----------------------------------------

    async def on_pod_event(self, kind: str, pod: dict[str, Any]) -> None:
        if not self.tracker.mine(pod):
            return
        meta = pod.get("metadata") or {}
        name = str(meta.get("name") or "")
        if not name:
            return
        if kind == "DELETED":
            if name in self.tasks:
                self.deleted.add(name)  # its cursor goes once the follower is done
            else:
                self._forget(name)
            return
        if name in self.tasks:
            return
        if container_started(pod) and not self._load(name)[1]:
            namespace = str(meta.get("namespace") or "default")
            node = str((pod.get("spec") or {}).get("nodeName") or "")
            task = asyncio.create_task(self._run(name, namespace, node), name=f"logs:{name}")
            self.tasks[name] = task
            task.add_done_callback(functools.partial(self._done, name))

    def _done(self, name: str, task: asyncio.Task[None]) -> None:
        self.tasks.pop(name, None)
        if name in self.deleted:
            self.deleted.discard(name)
            self._forget(name)
        if not task.cancelled() and task.exception() is not None:
            self.log.warning("log follower failed", instance=name, error=repr(task.exception())[:300])

    def settled(self, name: str) -> bool:
        """Whether everything the Pod's container printed is in the outbox (or can never be)."""
        return name not in self.tasks

    def shipped(self, name: str) -> bool:
        """Whether the queue has all of the Pod's log it can get: its follower followed it to
        its end, with its final chunk in the outbox, and it had output or this node serves no
        log (a stream with no bytes is not otherwise: a tail read later may still find what the
        follower could not; on a node that lists no address it would be refused the same way)."""
        cursor, final = self._load(name)
        if not final or name in self.tasks:
            return False
        return cursor.offset > 0 or self._logless_here()

    def _logless_here(self) -> bool:
        node = self.tracker.node
        return node is not None and self.logless.known(node) is not None

    async def close(self) -> None:
        tasks = list(self.tasks.values())
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self.cursors.close()

    # -- cursors ----------------------------------------------------------------------------------

    def _load(self, name: str) -> tuple[Cursor, bool]:
        mark = self.cursors.get(name)
        if mark is None:
            return Cursor(), False
        try:
            return Cursor.load(str(mark.get("cursor"))), bool(mark.get("final"))
        except (ValueError, AttributeError):
            return Cursor(), False

    def save(self, name: str, cursor: Cursor, *, final: bool) -> None:
        # Not fsynced: a cursor that lags after a crash only ships bytes again, which the
        # queue drops by offset.
        self.cursors.put(name, {"cursor": cursor.dump(), "final": final})

    def _forget(self, name: str) -> None:
        with contextlib.suppress(OSError):
            self.cursors.drop(name)

    # -- one follower ---------------------------------------------------------------------------

    def _ended(self, namespace: str, name: str) -> bool:
        pod = self.tracker.pod_in_cache(namespace, name)
        return pod is None or container_termination(pod) is not None

    async def _run(self, name: str, namespace: str, node: str) -> None:
        cursor, _ = self._load(name)
        await follow_container_log(
            self.api,
            namespace=namespace,
            name=name,
            cursor=cursor,
            sink=_OutboxSink(self, name),
            ended=lambda: self._ended(namespace, name),
            settings=self.settings,
            on_gap=lambda: self.on_gap(name, namespace),
            node=node,
            logless=self.logless,
        )


def _legacy_cursor(path: Path) -> tuple[str, dict[str, Any]] | None:
    """A cursor file of an earlier version: ``<instance>.json``."""
    if path.suffix != ".json":
        return None
    data = json.loads(path.read_text())
    return (path.stem, data) if isinstance(data, dict) else None


class _OutboxSink:
    """Chunks into the (durable) outbox, then the cursor file: a crash between the two ships
    the same bytes again, which the queue drops by offset."""

    def __init__(self, owner: LogFollowers, name: str) -> None:
        self.owner = owner
        self.name = name

    async def room(self) -> None:
        await self.owner.outbox.wait_log_room()

    async def ship(self, *, offset: int, data: bytes, cursor: Cursor, final: bool, note: str | None) -> None:
        self.owner.outbox.log_chunk(
            instance_id=self.name, offset=offset, data=data, cursor=cursor.dump(), final=final, note=note
        )
        self.owner.save(self.name, cursor, final=final)
