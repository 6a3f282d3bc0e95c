"""Live logs: for every Pod of its own whose ``user`` container started, the daemon follows the
container's log and ships it to the queue in ordered chunks through the outbox.

One task per Pod (:class:`LogFollowers`). A follower keeps a cursor (bytes shipped, the stamp of
the last shipped line and how many lines had it; :mod:`nymph.launch.logcursor`) in
``<state>/logs/<instance>.json``, written after each chunk is in the (durable) outbox; a dropped
stream or a daemon restart resumes from it, and the overlap is dropped here (by stamp) or at the
queue (by offset). Memory is bounded: at most ``chunk_bytes`` are buffered, and a follower waits
for room in the outbox before it reads on (the API server and the node hold the rest). When the
container has ended and its log is read to the end, the last chunk is ``final``; only then (or
when there is no log to read) does :meth:`LogFollowers.settled` let the reaper delete the Pod. A
node that serves no container logs (kwok: no kubelet) is noticed on the first answer and the
follower stops with a note, without retrying.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from nymph.daemon.durable import replace_atomically
from nymph.daemon.outbox import Outbox
from nymph.daemon.tracker import Tracker
from nymph.kube.errors import KubeError, NotFound
from nymph.kube.logstream import LogNotReady, NoContainerLog, open_log
from nymph.launch.logcursor import Cursor, Dedup, LineSplitter, parse_line
from nymph.launch.state import container_termination
from nymph.logs import get_logger


def container_started(pod: Mapping[str, Any], *, container: str = "user") -> bool:
    """Whether ``container`` has run (it is running or has ended after starting)."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if isinstance(cs, Mapping) and cs.get("name") == container:
            state = cs.get("state") or {}
            return state.get("running") is not None or bool(
                (state.get("terminated") or {}).get("containerID")
            )
    return False


@dataclass
class Chunker:
    """Lines in, chunks out: drops the overlap with what was shipped and keeps the cursor (pure)."""

    cursor: Cursor
    dedup: Dedup
    buf: bytearray
    skipping: bool = False  # the later pieces of a line that was shipped already

    @staticmethod
    def resume(cursor: Cursor) -> Chunker:
        return Chunker(cursor=cursor, dedup=Dedup(cursor), buf=bytearray())

    def line(self, raw: bytes, *, continued: bool) -> None:
        if continued:
            if not self.skipping:
                self.buf += raw
                self.cursor = self.cursor.after(None, len(raw))
            return
        stamp, text = parse_line(raw)
        self.skipping = not self.dedup.fresh(stamp)
        if not self.skipping:
            self.buf += text
            self.cursor = self.cursor.after(stamp, len(text))

    def take(self) -> tuple[bytes, int, Cursor]:
        """The buffered bytes, the offset they start at, and the cursor after them."""
        data = bytes(self.buf)
        self.buf.clear()
        return data, self.cursor.offset - len(data), self.cursor


class LogFollowers:
    def __init__(
        self,
        *,
        api: client.ApiClient,
        outbox: Outbox,
        tracker: Tracker,
        state_dir: Path,
        chunk_bytes: int = 256 * 1024,
        flush_seconds: float = 0.5,
        max_failures: int = 5,
        not_ready_seconds: float = 600.0,
    ) -> None:
        self.api = api
        self.outbox = outbox
        self.tracker = tracker
        self.dir = state_dir / "logs"
        self.chunk_bytes = chunk_bytes
        self.flush_seconds = flush_seconds
        self.max_failures = max_failures
        self.not_ready_seconds = not_ready_seconds
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.log = get_logger("logs")

    # -- the watch's callback and the reaper's question -----------------------------------------

    async def on_pod_event(self, kind: str, pod: dict[str, Any]) -> None:
        if not self.tracker.mine(pod):
            return
        meta = pod.get("metadata") or {}
        name = str(meta.get("name") or "")
        if not name or name in self.tasks:
            return
        if kind == "DELETED":
            self._forget(name)
            return
        if container_started(pod) and not self._load(name)[1]:
            namespace = str(meta.get("namespace") or "default")
            task = asyncio.create_task(self._run(name, namespace), name=f"logs:{name}")
            self.tasks[name] = task
            task.add_done_callback(functools.partial(self._done, name))

    def _done(self, name: str, task: asyncio.Task[None]) -> None:
        self.tasks.pop(name, None)
        if not task.cancelled() and task.exception() is not None:
            self.log.warning("log follower failed", instance=name, error=repr(task.exception())[:300])

    def settled(self, name: str) -> bool:
        """Whether everything the Pod's container printed is in the outbox (or can never be)."""
        return name not in self.tasks

    async def close(self) -> None:
        tasks = list(self.tasks.values())
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    # -- cursor files ---------------------------------------------------------------------------

    def _path(self, name: str) -> Path:
        return self.dir / f"{name}.json"

    def _load(self, name: str) -> tuple[Cursor, bool]:
        try:
            data = json.loads(self._path(name).read_text())
            return Cursor.load(str(data.get("cursor"))), bool(data.get("final"))
        except (OSError, ValueError, AttributeError):
            return Cursor(), False

    def _save(self, name: str, cursor: Cursor, *, final: bool) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        replace_atomically(self._path(name), json.dumps({"cursor": cursor.dump(), "final": final}).encode())

    def _forget(self, name: str) -> None:
        with contextlib.suppress(OSError):
            self._path(name).unlink()

    # -- one follower ---------------------------------------------------------------------------

    async def _ship(
        self, name: str, chunker: Chunker, *, final: bool = False, note: str | None = None
    ) -> None:
        await self.outbox.wait_log_room()
        data, offset, cursor = chunker.take()
        if data or final:
            self.outbox.log_chunk(
                instance_id=name, offset=offset, data=data, cursor=cursor.dump(), final=final, note=note
            )
            self._save(name, cursor, final=final)

    def _ended(self, namespace: str, name: str) -> bool:
        pod = self.tracker.pod_in_cache(namespace, name)
        return pod is None or container_termination(pod) is not None

    async def _run(self, name: str, namespace: str) -> None:
        cursor, _ = self._load(name)
        chunker = Chunker.resume(cursor)
        failures = 0
        started = time.monotonic()
        log = self.log.bind(instance=name)
        while True:
            chunker = Chunker.resume(chunker.cursor)
            try:
                got, rest = await self._read(name, namespace, chunker)
            except LogNotReady:
                if time.monotonic() - started > self.not_ready_seconds:
                    await self._ship(name, chunker, final=True, note="the container never started")
                    return
                await asyncio.sleep(1.0)
                continue
            except NoContainerLog as exc:
                log.info("the node serves no container log; not following it", detail=exc.message[:200])
                await self._ship(name, chunker, final=True, note=f"no container log: {exc.message[:300]}")
                return
            except NotFound:
                await self._ship(name, chunker, final=True, note="the Pod was gone before its log was read")
                return
            except KubeError as exc:
                failures += 1
                if failures > self.max_failures:
                    log.warning("giving up on the log", error=exc.message[:200])
                    await self._ship(name, chunker, final=True, note=f"log unavailable: {exc.message[:300]}")
                    return
                await self._ship(name, chunker)
                await asyncio.sleep(min(0.5 * 2**failures, 10.0))
                continue
            if self._ended(namespace, name):
                if rest is not None:
                    chunker.line(rest[0], continued=rest[1])
                await self._ship(name, chunker, final=True)
                return
            # The stream ended but the container runs on (the connection was closed): resume.
            failures = 0 if got else failures + 1
            if failures > self.max_failures:
                await self._ship(name, chunker, final=True, note="the log stream kept ending early")
                return
            await asyncio.sleep(0.2 if got else min(0.5 * 2**failures, 10.0))

    async def _read(
        self, name: str, namespace: str, chunker: Chunker
    ) -> tuple[bool, tuple[bytes, bool] | None]:
        """Read one stream to its end, shipping as it goes. Returns whether it brought anything
        and an unfinished last line (kept back: shipped only once the container ended)."""
        stamp = chunker.cursor.stamp
        splitter = LineSplitter()
        got = False
        deadline: float | None = None
        since = stamp.since_time if stamp else None
        async with open_log(self.api, namespace=namespace, name=name, since_time=since) as stream:
            while True:
                data = await stream.read(
                    timeout=None if deadline is None else max(0.0, deadline - time.monotonic())
                )
                if data is None:  # nothing came for a while: ship what is buffered
                    await self._ship(name, chunker)
                    deadline = None
                    continue
                if not data:
                    break
                got = True
                for line, continued in splitter.feed(data):
                    chunker.line(line, continued=continued)
                if len(chunker.buf) >= self.chunk_bytes or (
                    deadline is not None and time.monotonic() >= deadline
                ):
                    await self._ship(name, chunker)
                    deadline = None
                elif chunker.buf and deadline is None:
                    deadline = time.monotonic() + self.flush_seconds
        await self._ship(name, chunker)
        return got, splitter.rest()
