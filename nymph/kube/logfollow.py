"""Following one container's log to its end, shipping it in ordered chunks (the loop shared by
the daemon and, for direct launches, the queue).

:func:`follow_container_log` resumes from a :class:`nymph.launch.logcursor.Cursor`, reads the
stream (:mod:`nymph.kube.logstream`), drops the overlap with what was shipped, and hands chunks
of at most ``chunk_bytes`` (or whatever came within ``flush_seconds``) to a :class:`LogSink`,
which may make it wait (backpressure). A dropped stream is opened again from the cursor; when
the container has ended and the stream is read to its end, the last chunk is ``final``. A node
that serves no container log, a Pod gone, a container that never starts or a stream that keeps
failing end it with a ``final`` chunk carrying a note: it never retries without bound. A node
that lists no address serves no Pod's log: given its ``node`` and a
:class:`nymph.kube.loglessnodes.LoglessNodes`, the followers of the other Pods on it end at
once with the same note, without a request each.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from kubernetes_asyncio import client

from nymph.kube.errors import KubeError, NotFound
from nymph.kube.loglessnodes import LoglessNodes
from nymph.kube.logstream import LogNotReady, NoContainerLog, NodeHasNoAddress, open_log
from nymph.launch.logcursor import Chunker, Cursor, LineSplitter, Stamp, parse_line
from nymph.logsetup import get_logger


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
    #: A stream quiet this long while the container runs is opened again from the cursor: the
    #: kubelet may be stuck on a log file it rotated away (it moves to the new file only when
    #: it sees the file created, which a reader that fell behind misses). Doubles while such
    #: re-reads bring nothing, up to ``idle_reopen_max``.
    idle_reopen_seconds: float = 5.0
    idle_reopen_max: float = 60.0
    #: How many extra reads confirm the end once the container ended (each one that still
    #: brings lines asks for another).
    max_confirms: int = 3
    #: Lines whose stamps lie this much further apart than their arrivals (or, until the stream
    #: is known to follow the node's rotations, this much apart at all): the stream may have
    #: leapt past lines the node rotated away, which one more read checks (see
    #: :mod:`nymph.launch.logcursor`).
    leap_seconds: float = 1.0


@dataclass
class _Read:
    fresh: bool = False  # it brought lines that were not shipped before
    rest: tuple[bytes, bool] | None = None  # an unfinished last line, kept back
    idle: bool = False  # closed by us: quiet too long while the container runs
    ended: bool = False  # the API server ended it


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
    node: str = "",
    logless: LoglessNodes | None = None,
) -> None:
    """Follow the ``user`` container of Pod ``namespace/name`` until its log is complete;
    ``ended()`` says whether the container has ended (or the Pod is gone); ``on_gap()`` is
    called when a re-read finds that the node rotated unread lines away (the log then
    carries :data:`nymph.launch.logcursor.ROTATED` there). ``node`` (the key of the Pod's
    node in ``logless``) skips the request when the node is known to serve no log.

    Once the container ended and a stream brought its last lines, one more read from the
    cursor confirms the end: a kubelet stuck on a rotated file ends its stream at that file's
    end, and the lines after it are still in the node's current file."""
    s = settings or FollowSettings()
    log = get_logger("logs", instance=name)

    def gap() -> None:
        log.warning("the node rotated the log before it was read: lines may be missing")
        if on_gap is not None:
            on_gap()

    def resume(at: Cursor) -> Chunker:
        return Chunker.resume(at, on_gap=gap, leap_seconds=s.leap_seconds)

    chunker = resume(cursor)
    why = logless.known(node) if logless is not None and node else None
    if why is not None:
        await _ship(sink, chunker, final=True, note=f"no container log: {why}")
        return
    failures = confirms = 0
    idle_after = s.idle_reopen_seconds
    started = time.monotonic()
    while True:
        chunker = resume(chunker.cursor)
        try:
            got = await _read(api, namespace, name, chunker, sink, s, idle_after=idle_after, ended=ended)
        except LogNotReady:
            if time.monotonic() - started > s.not_ready_seconds:
                await _ship(sink, chunker, final=True, note="the container never started")
                return
            await asyncio.sleep(1.0)
            continue
        except NoContainerLog as exc:
            if isinstance(exc, NodeHasNoAddress) and logless is not None and node:
                if logless.remember(node, exc.message[:300]):
                    log.info(
                        "the node serves no container log; not following it, nor for a while the"
                        " log of any Pod on the node",
                        detail=exc.message[:200],
                        for_seconds=logless.ttl,
                    )
            else:
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
        if got.idle:
            idle_after = s.idle_reopen_seconds if got.fresh else min(idle_after * 2, s.idle_reopen_max)
            continue
        idle_after = s.idle_reopen_seconds
        if ended():
            if got.fresh and confirms < s.max_confirms:
                confirms += 1
                continue
            if got.rest is not None:
                chunker.line(got.rest[0], continued=got.rest[1])
            await _ship(sink, chunker, final=True)
            return
        # The stream ended while the container runs on (the connection was closed): resume.
        failures = 0 if got.fresh else failures + 1
        if failures > s.max_failures:
            await _ship(sink, chunker, final=True, note="the log stream kept ending early")
            return
        await asyncio.sleep(0.2 if got.fresh else min(0.5 * 2**failures, 10.0))


async def _rotated_since(api: client.ApiClient, namespace: str, name: str, stamp: Stamp) -> bool:
    """Whether the line stamped ``stamp`` is no longer in the container's current log file
    (lines after it may have been rotated away unread); when the node cannot say, assume so."""
    try:
        async with open_log(
            api, namespace=namespace, name=name, since_time=stamp.since_time, follow=False
        ) as stream:
            splitter = LineSplitter()
            while data := await stream.read(timeout=30.0):
                for line, continued in splitter.feed(data):
                    seen = None if continued else parse_line(line)[0]
                    if seen is not None and seen >= stamp:
                        return seen > stamp
    except KubeError:
        pass
    return True


async def _read(
    api: client.ApiClient,
    namespace: str,
    name: str,
    chunker: Chunker,
    sink: LogSink,
    s: FollowSettings,
    *,
    idle_after: float,
    ended: Callable[[], bool],
) -> _Read:
    """Read one stream to its end (or until it stays quiet ``idle_after`` seconds while the
    container runs), shipping as it goes. An unfinished last line is kept back: it is shipped
    only once the container ended."""
    stamp = chunker.cursor.stamp
    start = chunker.cursor.offset
    splitter = LineSplitter()
    out = _Read()
    deadline: float | None = None
    quiet_since = time.monotonic()
    since = stamp.since_time if stamp else None
    #: The time spent waiting for the stream (not shipping, checking or held up otherwise): the
    #: clock the leap check compares stamps with. A pause counts only when the stream was quiet.
    waited = 0.0
    async with open_log(api, namespace=namespace, name=name, since_time=since) as stream:
        while True:
            now = time.monotonic()
            wait = quiet_since + idle_after - now
            if deadline is not None:
                wait = min(wait, deadline - now)
            data = await stream.read(timeout=max(0.0, wait))
            waited += time.monotonic() - now
            if data is None:  # nothing came for a while: ship what is buffered
                await _ship(sink, chunker)
                deadline = None
                if time.monotonic() - quiet_since >= idle_after and not ended():
                    out.idle = True
                    break
                continue
            if not data:
                out.ended = True
                break
            for line, continued in splitter.feed(data):
                chunker.line(line, continued=continued, received=waited)
            if chunker.suspects:
                checks = [await _rotated_since(api, namespace, name, x.before) for x in chunker.suspects]
                chunker.settle(checks)
            if len(chunker.buf) >= s.chunk_bytes or (deadline is not None and time.monotonic() >= deadline):
                await _ship(sink, chunker)  # may wait for room: quiet counts from after it
                deadline = None
            elif chunker.buf and deadline is None:
                deadline = time.monotonic() + s.flush_seconds
            quiet_since = time.monotonic()
    await _ship(sink, chunker)
    out.fresh = chunker.cursor.offset > start
    out.rest = splitter.rest()
    return out
