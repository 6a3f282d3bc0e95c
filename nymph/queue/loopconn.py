"""The queue's synchronous SQL on PostgreSQL, run on the event loop's own thread.

The SQL functions (:mod:`nymph.queue.sql`) are synchronous: the same code runs on SQLite. On
PostgreSQL they used to run on a pool of threads, one transaction each, and every time psycopg
released the interpreter's lock around a network wait another thread took it: a launch POST
cost about a hundred thread switches, half of them across cores, and twice the CPU it costs
when the whole process is held to one core.

Here a transaction runs in a greenlet instead (:meth:`Runner.run`), on the event loop's thread, with a
:class:`LoopConnection`: a synchronous psycopg connection whose waits for the server
(:meth:`LoopConnection.wait`) switch back to the loop, which awaits the socket and switches in
again with the result. psycopg asks for a wait at every step of a statement, most of which
need none (a statement queued in a pipeline, a send): those run on in the greenlet, and only a
wait for the server's answer goes to the loop. The SQL code does not
change, transactions still overlap each other's round trips, and no thread is involved: while
one waits for PostgreSQL, the loop serves other requests and other transactions.

A transaction once started runs to its end even when its caller is cancelled (as a thread
did): :meth:`Runner.run` drives it in a task of its own and only shields the caller's wait; the
runner keeps those tasks, so that the database can wait for them as it closes.
"""

from __future__ import annotations

import asyncio
import contextvars
import select
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import psycopg
from greenlet import getcurrent, greenlet
from psycopg import waiting
from psycopg.abc import PQGen
from psycopg.pq import TransactionStatus
from psycopg.waiting import READY_NONE, READY_R, READY_W, WAIT_R, WAIT_RW, WAIT_W

T = TypeVar("T")
RV = TypeVar("RV")

#: The longest a transaction's greenlet runs psycopg's steps that need no wait before it leaves
#: the loop a turn (psycopg's own asyncio waits use the same).
MAX_BUSY = 0.005
#: How long a wait for the server relies on the loop alone: then it polls the socket itself and,
#: when nothing is ready, registers the socket with the loop again. A registration the loop
#: dropped without a word (uvloop drops a failed socket's) would otherwise be waited on forever
#: (psycopg's own asyncio waits poll the same way).
RECHECK = 1.0


class _Bridged(greenlet):  # type: ignore[misc]
    """A greenlet started by :meth:`Runner.run`: its waits go to the loop."""


class NotOnLoop(RuntimeError):
    """A wait asked for outside a greenlet started by :meth:`Runner.run`."""


def on_loop() -> bool:
    """Whether the caller runs in a greenlet started by :meth:`Runner.run`."""
    return isinstance(getcurrent(), _Bridged)


def await_only(awaitable: Awaitable[T]) -> T:
    """Wait for ``awaitable`` on the loop from a greenlet started by :meth:`Runner.run`."""
    current = getcurrent()
    if not isinstance(current, _Bridged):
        raise NotOnLoop("a loop wait outside nymph.queue.loopconn.Runner.run")
    return cast(T, current.parent.switch(_Wait(awaitable)))


class _Wait:
    __slots__ = ("awaitable",)

    def __init__(self, awaitable: Awaitable[Any]) -> None:
        self.awaitable = awaitable


async def _drive(fn: Callable[[], T], context: contextvars.Context) -> T:
    child = _Bridged(fn, getcurrent())
    # Each transaction gets its own copy of the caller's context variables (as a thread of
    # ``asyncio.to_thread`` would): what one sets is not seen by another.
    child.gr_context = context
    value: Any = child.switch()
    while not child.dead:
        if not isinstance(value, _Wait):
            raise RuntimeError("a greenlet of nymph.queue.loopconn.Runner.run switched back without a wait")
        try:
            result = await value.awaitable
        except BaseException as exc:  # every outcome goes back to the function
            value = child.throw(exc)
        else:
            value = child.switch(result)
    return cast(T, value)


class Runner:
    """Runs synchronous functions on the loop's thread (:meth:`run`) and keeps those under way,
    so that their owner can wait for them when it closes (:meth:`drain`)."""

    def __init__(self, *, name: str = "nymph-queue-pg") -> None:
        self.name = name
        self._running: set[asyncio.Task[Any]] = set()

    async def run(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on this loop's thread, its waits on :class:`LoopConnection`s served by the
        loop; to its end even if the caller is cancelled."""
        task = asyncio.get_running_loop().create_task(_drive(fn, contextvars.copy_context()), name=self.name)
        self._running.add(task)
        task.add_done_callback(self._ended)
        return await asyncio.shield(task)

    def _ended(self, task: asyncio.Task[Any]) -> None:
        """Forget an ended function; its error is marked read, since a caller cancelled while it
        ran is no longer there to read it (its caller, when there, still gets it through the
        shield), so asyncio does not report it as "never retrieved"."""
        self._running.discard(task)
        if not task.cancelled():
            task.exception()

    async def drain(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the functions under way to end."""
        pending = [t for t in self._running if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=timeout)


class LoopConnection(psycopg.Connection[Any]):
    """A synchronous psycopg connection on an :class:`psycopg.AsyncConnection`'s socket whose
    waits are served by the event loop (from a greenlet of :meth:`Runner.run`)."""

    @classmethod
    def twin(cls, aconn: psycopg.AsyncConnection[Any], *, row_factory: Any) -> LoopConnection:
        conn = cls(aconn.pgconn, row_factory=row_factory)
        conn._autocommit = aconn.autocommit
        # Pooled through its twin: nothing to warn about when it is dropped.
        conn._pool = None
        return conn

    #: The socket's reader while a transaction holds this connection (:meth:`hold`).
    _held: _HeldReader | None = None
    _holding = False

    def hold(self) -> None:
        """Keep one reader on the socket until :meth:`release`, while the caller holds this
        connection (a transaction, from the pool's ``getconn`` to its ``putconn``): each wait for
        the server's answer then only awaits it, where it would register a reader and remove it
        again (two ``epoll_ctl`` calls and a poll handle made and closed in the loop, every
        round trip). Released before the connection goes back to the pool, whose own
        asynchronous waits (its checks, its rollback) register their own reader on the same
        socket."""
        self._holding = True

    def release(self) -> None:
        """End :meth:`hold` (again: nothing)."""
        self._holding = False
        self._drop_reader()

    def _reader(self, fileno: int) -> _HeldReader | None:
        """The held reader on ``fileno`` (registered on first use), or None when not holding."""
        if not self._holding:
            return None
        held = self._held
        if held is not None and held.fileno == fileno:
            return held
        self._drop_reader()
        held = self._held = _HeldReader(asyncio.get_running_loop(), fileno)
        return held

    def _drop_reader(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            held.close()

    def wait(self, gen: PQGen[RV], interval: float = 0.1, timeout: float | None = None) -> RV:
        if not on_loop():
            raise NotOnLoop("a connection of the queue's pool used outside nymph.queue.loopconn.Runner.run")
        try:
            if timeout is not None:
                self._drop_reader()  # psycopg's own wait registers its own reader
                return await_only(
                    waiting.wait_async(gen, self.pgconn.socket, interval=interval, timeout=timeout)
                )
            return _drive_gen(gen, self.pgconn.socket, self)
        except BaseException:
            if self.pgconn.transaction_status == TransactionStatus.ACTIVE:
                # Stopped mid-statement: the server's answer would be read by the next user of
                # the connection. Closed, so the pool drops it.
                self._drop_reader()
                self.pgconn.finish()
            raise


class _HeldReader:
    """A reader kept on a socket: a wait sets :attr:`waiter`, which the loop completes when the
    socket is readable. Readable while nobody waits (an answer that arrived before it is read),
    the loop's call only sets :attr:`ready`, which the next wait checks before it waits: uvloop
    calls a reader once more when its socket fails (a reset, say) and then drops the reader
    for good, so that call may be the last this socket ever gets."""

    __slots__ = ("fileno", "loop", "ready", "waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop, fileno: int) -> None:
        self.loop = loop
        self.fileno = fileno
        self.waiter: asyncio.Future[int] | None = None
        self.ready = False
        loop.add_reader(fileno, self._readable)

    def _readable(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(READY_R)
        else:
            self.ready = True

    def rearm(self) -> None:
        """Register the socket with the loop again (see :data:`RECHECK`)."""
        self.loop.remove_reader(self.fileno)
        self.loop.add_reader(self.fileno, self._readable)

    def close(self) -> None:
        self.loop.remove_reader(self.fileno)


def _time_up(done: asyncio.Future[int]) -> None:
    if not done.done():
        done.set_result(READY_NONE)


def _drive_gen(gen: PQGen[RV], fileno: int, conn: LoopConnection | None = None) -> RV:
    """Drive psycopg's generator ``gen`` on socket ``fileno`` from this greenlet, going to the
    loop only when the socket must be waited for. Most of a transaction's steps never wait (a
    statement queued in a pipeline, bytes sent to a socket that takes them): they cost no switch
    to the loop and back, no coroutine, no reader registered. A launch's transaction, three
    round trips, goes to the loop three times (it went fourteen times). A long run of steps that
    never wait (a bulk insert's rows) still leaves the loop a turn every :data:`MAX_BUSY`
    seconds, as psycopg's own asyncio waits do."""
    try:
        state = next(gen)
        busy_since = time.monotonic()
        while True:
            if not state & WAIT_RW:
                raise psycopg.InternalError(f"bad poll status: {state}")
            # A socket asked for writing nearly always takes bytes at once: a poll of no
            # timeout costs less than a round through the loop (psycopg's pipeline asks for it,
            # with reading, at every statement it sends).
            ready = _ready_now(fileno, state) if state & WAIT_W else READY_NONE
            if not ready:
                ready = _ready_later(fileno, state, None if conn is None else conn._reader(fileno))
                busy_since = time.monotonic()
            elif time.monotonic() - busy_since >= MAX_BUSY:
                await_only(asyncio.sleep(0))
                busy_since = time.monotonic()
            state = gen.send(ready)
    except StopIteration as stop:
        return cast(RV, stop.value)
    except OSError as exc:
        raise psycopg.OperationalError("connection socket closed") from exc


def _ready_now(fileno: int, state: int) -> int:
    """What ``fileno`` is ready for right now, of ``state`` (WAIT_W or WAIT_RW)."""
    poller = select.poll()
    poller.register(fileno, (select.POLLIN if state & WAIT_R else 0) | select.POLLOUT)
    ready: int = READY_NONE
    for _, events in poller.poll(0):
        if events & select.POLLIN:
            ready |= READY_R
        if events & (select.POLLOUT | select.POLLERR | select.POLLHUP):
            ready |= READY_W
    return ready


def _ready_later(fileno: int, state: int, held: _HeldReader | None = None) -> int:
    """Wait on the loop until ``fileno`` is ready for ``state`` (WAIT_R, WAIT_W or WAIT_RW);
    reading through ``held`` when given (see :meth:`LoopConnection.hold`). Every
    :data:`RECHECK` seconds without news the socket is polled here, and registered again."""
    if held is not None and state == WAIT_R:
        return _held_read(fileno, held)
    loop = asyncio.get_running_loop()
    while True:
        done: asyncio.Future[int] = loop.create_future()

        def wake(ready: int, done: asyncio.Future[int] = done) -> None:
            if not done.done():
                done.set_result(ready)

        timer = loop.call_later(RECHECK, _time_up, done)
        reading = writing = False
        try:
            if state & WAIT_R:
                if held is not None:
                    held.waiter = done
                else:
                    loop.add_reader(fileno, wake, READY_R)
                    reading = True
            if state & WAIT_W:
                loop.add_writer(fileno, wake, READY_W)
                writing = True
            ready = await_only(done)
        finally:
            timer.cancel()
            if held is not None:
                held.waiter = None
            if reading:
                loop.remove_reader(fileno)
            if writing:
                loop.remove_writer(fileno)
        if ready != READY_NONE:
            return ready
        ready = _ready_now(fileno, WAIT_W) & READY_W if state & WAIT_W else READY_NONE
        if state & WAIT_R and _readable_now(fileno):
            ready |= READY_R
        if ready:
            return ready
        if held is not None:
            held.rearm()


def _held_read(fileno: int, held: _HeldReader) -> int:
    """Wait through ``held`` until ``fileno`` has something to read. A loop can report a
    socket readable from a poll made before the last read emptied it (asyncio's runs that
    report after the code that read): each wake is checked with a poll of no timeout, so that
    psycopg is never handed a readiness that is no longer true. A wake that came while nobody
    waited (:attr:`_HeldReader.ready`) is checked the same way before waiting: it may have been
    the socket's last (see :class:`_HeldReader`); and a wait with no news for :data:`RECHECK`
    seconds registers the socket again."""
    loop = held.loop
    while True:
        if held.ready:
            held.ready = False
            if _readable_now(fileno):
                return READY_R
        done: asyncio.Future[int] = loop.create_future()
        held.waiter = done
        timer = loop.call_later(RECHECK, _time_up, done)
        try:
            woken = await_only(done)
        finally:
            held.waiter = None
            timer.cancel()
        if _readable_now(fileno):
            return READY_R
        if woken == READY_NONE:
            held.rearm()


def _readable_now(fileno: int) -> bool:
    """Whether reading ``fileno`` would not block (data, the end of the stream, or an error
    that the read will raise)."""
    poller = select.poll()
    poller.register(fileno, select.POLLIN)
    return any(events & (select.POLLIN | select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
