"""The per-process cache of daemon sessions: known sessions are confirmed together, in one read
every ``CACHE_SECONDS`` (of one row while no session was removed or cut short), and a session
replaced or removed through another replica is still refused here within that time (on SQLite
and on PostgreSQL)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from nymph.queue import sessions
from nymph.queue.models import Principal, Role, SessionSettings
from nymph.queue.sessions import CACHE_SECONDS, IDLE_FORGET_SECONDS, SessionStore
from nymph.queue.sql import sessions as sql
from tests.support.queue_helpers import Queue

BOOTSTRAP = Principal(token_id="tok-bootstrap", role=Role.DAEMON, name="daemon bootstrap")


class Clock:
    """A clock the test moves (session expiries are wall-clock times: it starts at now)."""

    def __init__(self) -> None:
        import time

        self.now = time.time()

    def __call__(self) -> float:
        return self.now


class CountingDb:
    """The queue's database, counting the reads a session store makes through it."""

    def __init__(self, db: Any) -> None:
        self._db = db
        self.reads = 0

    async def read_one(self, fn: Callable[[Any], Any]) -> Any:
        self.reads += 1
        return await self._db.read_one(fn)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


async def _registered(store: SessionStore, n: int, *, prefix: str = "d") -> list[str]:
    return [
        (
            await store.register(bootstrap=BOOTSTRAP, daemon_id=f"{prefix}{k}", node=f"n{k}", namespaces=())
        ).credential
        for k in range(n)
    ]


def _store(queue: Queue, clock: Clock) -> tuple[SessionStore, CountingDb]:
    db = CountingDb(queue.store.db)
    return SessionStore(settings=SessionSettings(), db=db, clock=clock), db  # type: ignore[arg-type]


async def _known(queue: Queue, clock: Clock, n: int) -> tuple[SessionStore, CountingDb, list[str]]:
    """A store of its own on ``queue``'s database with ``n`` sessions registered and each
    authenticated once (known here)."""
    store, db = _store(queue, clock)
    creds = await _registered(store, n)
    for cred in creds:
        assert (await store.authenticate(cred))[0] is not None
    return store, db, creds


def _count_shared_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that gets the number of sessions of each shared read of their rows from now on."""
    asked: list[int] = []
    real = sql.expiries

    def counting(conn: Any, *, digests: Any) -> dict[str, float]:
        asked.append(len(digests))
        return real(conn, digests=digests)

    monkeypatch.setattr(sessions.sql, "expiries", counting)
    return asked


async def test_known_sessions_are_read_again_together_once_per_window(queue: Queue) -> None:
    """Fifty daemons calling again after the cache window cost one confirmation between them,
    not a read each (the first time: the count of removed sessions and their rows; then the
    count alone); within the window, none."""
    clock = Clock()
    store, db = _store(queue, clock)
    creds = await _registered(store, 50)
    for cred in creds:
        assert (await store.authenticate(cred))[0] is not None
    first = db.reads
    assert first >= 50  # each one unknown here until its first call
    for cred in creds:
        assert (await store.authenticate(cred))[0] is not None
    assert db.reads == first, "a known session was read again inside the window"
    clock.now += CACHE_SECONDS
    for cred in creds:
        assert (await store.authenticate(cred))[0] is not None
    assert db.reads == first + 2
    clock.now += CACHE_SECONDS
    for cred in creds:
        assert (await store.authenticate(cred))[0] is not None
    assert db.reads == first + 3


async def test_calls_waiting_for_the_same_confirmation_share_its_read(queue: Queue) -> None:
    clock = Clock()
    store, db, creds = await _known(queue, clock, 20)
    clock.now += CACHE_SECONDS
    before = db.reads
    got = await asyncio.gather(*(store.authenticate(c) for c in creds))
    assert all(s is not None and not lapsed for s, lapsed in got)
    assert db.reads == before + 2  # the count of removed sessions, then (the first time) the rows


async def test_a_session_replaced_through_another_replica_is_refused_within_the_window(queue: Queue) -> None:
    """Another replica (a store of its own on the same database) registers the daemon id
    again: the old credential, known here, is refused once the window has passed, and the new
    one is accepted."""
    clock = Clock()
    here, _ = _store(queue, clock)
    there = SessionStore(settings=SessionSettings(), db=queue.store.db)
    [old] = await _registered(here, 1)
    assert (await here.authenticate(old))[0] is not None
    new = (await there.register(bootstrap=BOOTSTRAP, daemon_id="d0", node="n0", namespaces=())).credential
    clock.now += CACHE_SECONDS
    assert await here.authenticate(old) == (None, False)
    session, lapsed = await here.authenticate(new)
    assert session is not None and session.daemon_id == "d0" and not lapsed


async def test_a_session_removed_from_the_database_is_refused_within_the_window(queue: Queue) -> None:
    clock = Clock()
    store, _ = _store(queue, clock)
    keep, gone = await _registered(store, 2)
    for cred in (keep, gone):
        await store.authenticate(cred)
    await queue.store.db.write(lambda c: c.execute("DELETE FROM daemon_sessions WHERE daemon_id = 'd1'"))
    clock.now += CACHE_SECONDS
    assert await store.authenticate(gone) == (None, False)
    assert (await store.authenticate(keep))[0] is not None


async def test_while_no_session_is_removed_the_confirmation_reads_one_row_not_the_sessions(
    queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fifty known sessions are confirmed window after window by reading the database's count
    of sessions removed or cut short, not their rows; once one is removed (by whatever
    statement: the count is kept by triggers), the next confirmation reads them all again."""
    clock = Clock()
    store, db, creds = await _known(queue, clock, 50)
    asked = _count_shared_reads(monkeypatch)
    clock.now += CACHE_SECONDS  # the first confirmation here reads them all
    await store.authenticate(creds[0])
    assert asked == [50]
    reads = db.reads
    for _ in range(3):
        clock.now += CACHE_SECONDS
        for cred in creds:
            assert (await store.authenticate(cred))[0] is not None
    assert db.reads - reads == 3, "one read per window"
    assert asked == [50], "the sessions were read again though none was removed"
    await queue.store.db.write(lambda c: c.execute("DELETE FROM daemon_sessions WHERE daemon_id = 'd7'"))
    clock.now += CACHE_SECONDS
    assert await store.authenticate(creds[7]) == (None, False)
    assert asked == [50, 50]
    assert (await store.authenticate(creds[8]))[0] is not None


async def test_an_expiry_moved_forward_by_another_replica_never_moves_back(queue: Queue) -> None:
    """A session another replica has extended is still accepted here on the expiry known here;
    the extension this replica then writes leaves the database's later expiry as it is."""
    clock = Clock()
    store, _, [cred] = await _known(queue, clock, 1)
    ttl = SessionSettings().ttl_seconds
    later = clock.now + 2 * ttl
    await queue.store.db.write(lambda c: c.execute("UPDATE daemon_sessions SET expires_at = ?", (later,)))
    # A call every window until this replica's own extension is due, and past it.
    start = clock.now
    while clock.now < start + ttl * sessions.EXTEND_FRACTION + 2 * CACHE_SECONDS:
        clock.now += CACHE_SECONDS
        session, lapsed = await store.authenticate(cred)
        assert session is not None and not lapsed
    await store.flush_extended()
    got = await queue.store.db.read_one(
        lambda c: c.execute("SELECT expires_at FROM daemon_sessions").fetchone()
    )
    assert float(got[0]) == later


async def test_a_session_that_lapsed_in_the_database_is_refused_as_lapsed(queue: Queue) -> None:
    clock = Clock()
    store, _, [cred] = await _known(queue, clock, 1)
    past = clock.now - 1.0
    await queue.store.db.write(lambda c: c.execute("UPDATE daemon_sessions SET expires_at = ?", (past,)))
    clock.now += CACHE_SECONDS
    assert await store.authenticate(cred) == (None, True)


async def test_the_shared_read_holds_only_the_sessions_still_calling(
    queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session unused for ``IDLE_FORGET_SECONDS`` is left out of the shared read (and read
    on its own, once, if it calls again)."""
    clock = Clock()
    store, _, creds = await _known(queue, clock, 5)
    asked = _count_shared_reads(monkeypatch)

    async def removed_elsewhere() -> None:
        """A session none of these is removed: the next confirmation reads the known ones."""
        await store.register(bootstrap=BOOTSTRAP, daemon_id="other", node="n-other", namespaces=())
        await queue.store.db.write(
            lambda c: c.execute("DELETE FROM daemon_sessions WHERE daemon_id = 'other'")
        )

    await removed_elsewhere()
    clock.now += IDLE_FORGET_SECONDS - 1
    await store.authenticate(creds[0])  # the only one still calling
    await removed_elsewhere()
    clock.now += CACHE_SECONDS
    await store.authenticate(creds[0])
    assert asked == [5, 1]
    session, lapsed = await store.authenticate(creds[1])  # back after a long pause
    assert session is not None and not lapsed


async def test_a_failed_shared_read_fails_its_calls_and_the_next_call_reads_again(
    queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    store, _, [cred] = await _known(queue, clock, 1)
    clock.now += CACHE_SECONDS

    def broken(conn: Any) -> int:
        raise RuntimeError("the database is away")

    monkeypatch.setattr(sessions.sql, "removed", broken)
    with pytest.raises(RuntimeError):
        await store.authenticate(cred)
    monkeypatch.undo()
    session, lapsed = await store.authenticate(cred)
    assert session is not None and not lapsed


async def test_a_call_cancelled_while_waiting_leaves_the_shared_read_to_the_others(queue: Queue) -> None:
    clock = Clock()
    store, _, creds = await _known(queue, clock, 2)
    clock.now += CACHE_SECONDS
    first = asyncio.create_task(store.authenticate(creds[0]))
    second = asyncio.create_task(store.authenticate(creds[1]))
    await asyncio.sleep(0)  # both wait for the same read now
    first.cancel()
    session, lapsed = await second
    assert session is not None and not lapsed
    with pytest.raises(asyncio.CancelledError):
        await first
