"""Daemon sessions: the per-daemon credential of the dispatch API.

Every DaemonSet Pod holds the same bootstrap token (role ``daemon``), so a token alone cannot
tell daemons apart. A daemon registers with it (``POST /v1/dispatch/register``: daemon id, node,
the kube namespaces it serves) and gets a session credential of its own, random and kept here
only as its sha256 hash, bound to that daemon id, node and namespaces and to the bootstrap
token's own scope. Every other dispatch call needs the session credential; leases, report stream
marks and the node of ``active`` are bound to the session's identity.

Sessions live in the database (hash only), so every queue replica accepts every session and a
restarted queue keeps them; a session it does not know is answered 401 ``unknown_session``, on
which the daemon registers again (leases are bound to the daemon id, so they survive). A session
lapses ``ttl_seconds`` after its last call (401 ``session_expired``).

A daemon id has one live session. Registering it again from the same node with a bootstrap
token of the same scope replaces the old session (a restarted daemon keeps its id and must get
back in), but nothing of the old session is handed over: the caller releases its leases back to
the queue (:attr:`Registered.replaced`), so a new session never completes or renews the work of
the one it replaced. It is still the same daemon for the instances that one ran: its reports,
logs and results on them (often replayed from its outbox) are taken until another daemon claims
them (see :mod:`nymph.queue.sql.binding`). A live session on another node, or registered with a token of
another scope, is not replaced (409 ``daemon_id_in_use``). The holder of the bootstrap token is
trusted for the identity it declares; what a session prevents is one daemon acting as another,
or outside the namespaces it registered for.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from nymph.queue.db import Backend
from nymph.queue.duewrites import DueWrites
from nymph.queue.errors import Conflict, ServiceError
from nymph.queue.models import DaemonSession, Principal, Role, SessionSettings
from nymph.queue.sql import sessions as sql
from nymph.queue.sql.dialect import DAEMON_KEYS, Conn, lock_key

SESSION_PREFIX = "nyd_"
#: How long this process trusts the sessions it knows without confirming them (a session
#: replaced or removed through another replica is refused here at most this much later). They
#: are confirmed together (:meth:`SessionStore.authenticate`): a thousand daemons each calling
#: every few seconds cost one read every ``CACHE_SECONDS``, not one per call, and that read is of
#: the database's count of sessions removed or cut short (kept by triggers: one row on SQLite,
#: 16 summed on PostgreSQL) unless that count moved, when the known sessions are read again in
#: one statement.
CACHE_SECONDS = 2.0
#: A known session unused for this long is forgotten (read again at its next call), so the
#: reads that confirm the known sessions hold only those of daemons that are calling (a daemon
#: calls at least once per long-poll hold, 50 s by default).
IDLE_FORGET_SECONDS = 180.0
#: The most sessions this process keeps known (past that it starts again).
MAX_CACHED = 10_000
#: A session's expiry is moved forward once this part of its ttl has passed; the new expiries
#: are written in one batch every few seconds (:meth:`SessionStore.flush_extended`).
EXTEND_FRACTION = 0.1


class TooManySessions(ServiceError):
    status = 429
    default_code = "too_many_sessions"


def _digest(credential: str) -> str:
    return hashlib.sha256(credential.encode("utf-8", errors="surrogatepass")).hexdigest()


@dataclass(frozen=True)
class Registered:
    """A new session: the credential (shown once) and when it lapses if unused."""

    credential: str
    session: DaemonSession
    expires_at: float
    #: The live session of the same daemon id this one replaced (its leases are to be released).
    replaced: DaemonSession | None = None


@dataclass(slots=True)
class _Known:
    session: DaemonSession
    #: when a call last used it here
    used: float
    #: when it lapses, as far as this process knows
    expires: float


class SessionStore:
    """Sessions in the database (any replica accepts any daemon's session), with a per-process
    cache of known credentials, confirmed against the database together every
    :data:`CACHE_SECONDS`, so that a dispatch call rarely reads them."""

    def __init__(
        self, *, settings: SessionSettings, db: Backend, clock: Callable[[], float] = time.time
    ) -> None:
        self._settings = settings
        self._db = db
        self._clock = clock
        #: credential hash -> the session, as known here
        self._cache: dict[str, _Known] = {}
        #: when every session in the cache was last read from the database (a session read
        #: since then, on its own, is newer still)
        self._confirmed_at = 0.0
        self._confirming: asyncio.Task[None] | None = None
        #: the database's count of sessions removed or cut short at the last confirmation
        #: (:func:`nymph.queue.sql.sessions.removed`); None before the first
        self._removed_seen: int | None = None
        #: credential hash -> the expiry it was extended to here, not written yet: a daemon's
        #: calls extend its session, and a thousand daemons would otherwise each cost a write
        #: transaction (an fsync on SQLite) every ``ttl * EXTEND_FRACTION``.
        self._extended = DueWrites(lambda conn, due: sql.extend_many(conn, due))

    def forget_cached(self) -> None:
        self._cache.clear()

    async def flush_extended(self) -> int:
        """Write the expiries extended since the last flush, in one transaction; how many.
        Run every few seconds on every replica: an extension is due once a tenth of the ttl has
        passed, so the database's expiry is still most of a ttl away when it is queued, and a
        batch lost with a replica costs no daemon its session."""
        return await self._extended.flush(self._db)

    async def register(
        self, *, bootstrap: Principal, daemon_id: str, node: str, namespaces: tuple[str, ...]
    ) -> Registered:
        credential = SESSION_PREFIX + secrets.token_urlsafe(32)
        session = DaemonSession(
            session_id="ses-" + secrets.token_hex(6),
            daemon_id=daemon_id,
            node=node,
            namespaces=namespaces,
            token_id=bootstrap.token_id,
            scope=bootstrap.namespace,
        )
        digest = _digest(credential)
        settings = self._settings

        def txn(conn: Conn) -> tuple[float, DaemonSession | None]:
            now = time.time()
            replaced: DaemonSession | None = None
            # One registration of a daemon id at a time, on any replica (each reads the live
            # session it replaces).
            lock_key(conn, DAEMON_KEYS, daemon_id)
            for row in sql.live_of_daemon(conn, daemon_id=daemon_id):
                if row["expires_at"] > now:
                    live = sql.session_of(row)
                    if live.node and live.node != node:
                        raise Conflict(
                            f"daemon id {daemon_id!r} has a live session on node {live.node!r}: give "
                            "each daemon its own id (the default, node name and pid, is unique)",
                            code="daemon_id_in_use",
                        )
                    if live.scope != bootstrap.namespace:
                        raise Conflict(
                            f"daemon id {daemon_id!r} has a live session registered with a token of "
                            "another scope: give each daemon its own id",
                            code="daemon_id_in_use",
                        )
                    replaced = live
                sql.drop(conn, digest=row["digest"])
            live_count = sql.count(conn)
            if live_count >= settings.max_sessions:
                sql.purge(conn, now=now)
                live_count = sql.count(conn)
                if live_count >= settings.max_sessions:
                    raise TooManySessions(
                        f"{live_count} daemon sessions are live, the most the queue keeps: "
                        "retry once idle ones have lapsed"
                    )
            expires = now + settings.ttl_seconds
            sql.insert(conn, digest=digest, session=session, expires_at=expires)
            return expires, replaced

        expires_at, replaced = await self._db.write(txn)
        gone = {d for d, e in self._cache.items() if e.session.daemon_id == daemon_id}
        self._cache = {d: e for d, e in self._cache.items() if d not in gone}
        for d in gone:
            self._extended.discard(d)
        return Registered(credential=credential, session=session, expires_at=expires_at, replaced=replaced)

    async def authenticate(self, credential: str) -> tuple[DaemonSession | None, bool]:
        """(the session, False) for a live credential, extending it; (None, True) for a lapsed
        one; (None, False) for one never issued (or replaced, or removed)."""
        digest = _digest(credential)
        if self._clock() - self._confirmed_at >= CACHE_SECONDS:
            await self._confirm()
        now = self._clock()
        known = self._cache.get(digest)
        if known is not None and known.expires > now:
            known.used = now
            known.expires = self._extend(digest, known.expires, now)
            return known.session, False
        row = await self._db.read_one(lambda conn: sql.by_digest(conn, digest=digest))
        now = self._clock()
        if row is None:
            self._cache.pop(digest, None)
            self._extended.discard(digest)
            return None, False
        # The expiry as last extended here, if that is not written yet.
        expires = max(float(row["expires_at"]), self._extended.get(digest) or 0.0)
        if expires <= now:
            self._cache.pop(digest, None)
            self._extended.discard(digest)
            await self._db.write(lambda conn: sql.drop(conn, digest=digest))
            return None, True
        session = sql.session_of(row)
        if len(self._cache) >= MAX_CACHED:
            self._cache.clear()
        self._cache[digest] = _Known(session=session, used=now, expires=self._extend(digest, expires, now))
        return session, False

    def _extend(self, digest: str, expires: float, now: float) -> float:
        """The session's expiry after a call at ``now``: moved forward only once a good part of
        the ttl went by, and written with the others due (fewer writes)."""
        ttl = self._settings.ttl_seconds
        if expires - now < ttl * (1 - EXTEND_FRACTION):
            expires = now + ttl
            self._extended.put(digest, expires)
        return expires

    async def _confirm(self) -> None:
        """Confirm every known session, in one read shared by the calls that wait for it; a
        call cancelled meanwhile leaves it to the others."""
        task = self._confirming
        if task is None:
            task = asyncio.create_task(self._confirm_known(), name="nymph-sessions-confirm")
            self._confirming = task
            task.add_done_callback(self._confirm_done)
        await asyncio.shield(task)

    def _confirm_done(self, task: asyncio.Task[None]) -> None:
        self._confirming = None
        if not task.cancelled():
            task.exception()  # retrieved: the calls that awaited it raised it

    async def _confirm_known(self) -> None:
        started = self._clock()
        for digest in [d for d, k in self._cache.items() if started - k.used >= IDLE_FORGET_SECONDS]:
            del self._cache[digest]
        digests = list(self._cache)
        if not digests:
            self._confirmed_at = max(self._confirmed_at, started)
            return
        # The count first: a session removed after it is read is counted at the next one.
        removed = await self._db.read_one(sql.removed)
        if removed == self._removed_seen:
            # None was removed or cut short since the last read: each known session is there,
            # with the expiry known here or a later one (another replica's extension, read on
            # its own once the one known here has passed).
            self._confirmed_at = max(self._confirmed_at, started)
            return
        found = await self._db.read_one(lambda conn: sql.expiries(conn, digests=digests))
        for digest in digests:
            known = self._cache.get(digest)
            if known is None:
                continue
            expires = found.get(digest)
            if expires is None:  # replaced or removed (a credential never comes back)
                del self._cache[digest]
                self._extended.discard(digest)
                continue
            # Another replica may have moved it forward; this one's extension may be unwritten.
            known.expires = max(expires, self._extended.get(digest) or 0.0)
        self._removed_seen = removed
        self._confirmed_at = max(self._confirmed_at, started)


def session_principal(session: DaemonSession) -> Principal:
    """The caller of a dispatch route: the session's daemon, with its bootstrap token's scope."""
    return Principal(
        token_id=session.session_id,
        role=Role.DAEMON,
        namespace=session.scope,
        name=f"daemon {session.daemon_id}",
        session=session,
    )
