"""Following one container's log to its end, shipping it in ordered chunks (the loop shared by
the daemon and, for direct launches, the queue).

:func:`follow_container_log` resumes from a :class:`nymph.launch.logcursor.Cursor`, reads the
stream (:mod:`nymph.kube.logstream`), drops the overlap with what was shipped, and hands chunks
of at most ``chunk_bytes`` (or whatever came within ``flush_seconds``) to a :class:`LogSink`,
which may make it wait (backpressure). A dropped stream is opened again from the cursor; when
the container has ended and the stream is read to its end, the last chunk is ``final``. A node
that serves no container log, a Pod gone, a container that never starts or a stream that keeps
failing end it with a ``final`` chunk carrying a note: it never retries without bound.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from kubernetes_asyncio import client

from nymph.kube.errors import KubeError, NotFound
from nymph.kube.logstream import LogNotReady, NoContainerLog, open_log
from nymph.launch.logcursor import Chunker, Cursor, LineSplitter
from nymph.logs import get_logger


class LogSink(Protocol):
    async def room(self) -> None:
        """Return once another chunk may be shipped (backpressure)."""

    async def ship(self, *, offset: int, data: bytes, cursor: Cursor, final: bool, note: str | None) -> None:
        """Ship ``data`` (the log from byte ``offset``; ``cursor`` is where it ends)."""


@dataclass(frozen=True)
class FollowSettings:
    chunk_bytes: int = 256 * 1024
    flush_seconds: float = 0.5
    max_failures: int = 5
    not_ready_seconds: float = 600.0


async def _ship(sink: LogSink, chunker: Chunker, *, final: bool = False, note: str | None = None) -> None:
    await sink.room()
    data, offset, cursor = chunker.take()
    if data or final:
        await sink.ship(offset=offset, data=data, cursor=cursor, final=final, note=note)


async def follow_container_log(
    api: client.ApiClient,
    *,
    namespace: str,
    name: str,
    cursor: Cursor,
    sink: LogSink,
    ended: Callable[[], bool],
    settings: FollowSettings | None = None,
    on_gap: Callable[[], None] | None = None,
) -> None:
    """Follow the ``user`` container of Pod ``namespace/name`` until its log is complete;
    ``ended()`` says whether the container has ended (or the Pod is gone); ``on_gap()`` is
    called when a resumed read finds that the node rotated unread lines away (the log then
    carries :data:`nymph.launch.logcursor.ROTATED` there)."""
    s = settings or FollowSettings()
    log = get_logger("logs", instance=name)

    def gap() -> None:
        log.warning("the node rotated the log before it was read: lines are missing")
        if on_gap is not None:
            on_gap()

    chunker = Chunker.resume(cursor, on_gap=gap)
    failures = 0
    started = time.monotonic()
    while True:
        chunker = Chunker.resume(chunker.cursor, on_gap=gap)
        try:
            got, rest = await _read(api, namespace, name, chunker, sink, s)
        except LogNotReady:
            if time.monotonic() - started > s.not_ready_seconds:
                await _ship(sink, chunker, final=True, note="the container never started")
                return
            await asyncio.sleep(1.0)
            continue
        except NoContainerLog as exc:
            log.info("the node serves no container log; not following it", detail=exc.message[:200])
            await _ship(sink, chunker, final=True, note=f"no container log: {exc.message[:300]}")
            return
        except NotFound:
            await _ship(sink, chunker, final=True, note="the Pod was gone before its log was read")
            return
        except KubeError as exc:
            failures += 1
            await _ship(sink, chunker)
            if failures > s.max_failures:
                log.warning("giving up on the log", error=exc.message[:200])
                await _ship(sink, chunker, final=True, note=f"log unavailable: {exc.message[:300]}")
                return
            await asyncio.sleep(min(0.5 * 2**failures, 10.0))
            continue
        if ended():
            if rest is not None:
                chunker.line(rest[0], continued=rest[1])
            await _ship(sink, chunker, final=True)
            return
        # The stream ended while the container runs on (the connection was closed): resume.
        failures = 0 if got else failures + 1
        if failures > s.max_failures:
            await _ship(sink, chunker, final=True, note="the log stream kept ending early")
            return
        await asyncio.sleep(0.2 if got else min(0.5 * 2**failures, 10.0))


async def _read(
    api: client.ApiClient,
    namespace: str,
    name: str,
    chunker: Chunker,
    sink: LogSink,
    s: FollowSettings,
) -> tuple[bool, tuple[bytes, bool] | None]:
    """Read one stream to its end, shipping as it goes. Returns whether it brought anything
    and an unfinished last line (kept back: shipped only once the container ended)."""
    stamp = chunker.cursor.stamp
    splitter = LineSplitter()
    got = False
    deadline: float | None = None
    since = stamp.since_time if stamp else None
    async with open_log(api, namespace=namespace, name=name, since_time=since) as stream:
        while True:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            data = await stream.read(timeout=wait)
            if data is None:  # nothing came for a while: ship what is buffered
                await _ship(sink, chunker)
                deadline = None
                continue
            if not data:
                break
            got = True
            for line, continued in splitter.feed(data):
                chunker.line(line, continued=continued)
            if len(chunker.buf) >= s.chunk_bytes or (deadline is not None and time.monotonic() >= deadline):
                await _ship(sink, chunker)
                deadline = None
            elif chunker.buf and deadline is None:
                deadline = time.monotonic() + s.flush_seconds
    await _ship(sink, chunker)
    return got, splitter.rest()
