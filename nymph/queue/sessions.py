"""Daemon sessions: the per-daemon credential of the dispatch API.

Every DaemonSet Pod holds the same bootstrap token (role ``daemon``), so a token alone cannot
tell daemons apart. A daemon registers with it (``POST /v1/dispatch/register``: daemon id, node,
the kube namespaces it serves) and gets a session credential of its own, random and kept here
only as its sha256 hash, bound to that daemon id, node and namespaces and to the bootstrap
token's own scope. Every other dispatch call needs the session credential; leases, report stream
marks and the node of ``active`` are bound to the session's identity.

Sessions live in memory: a restarted queue has none, and each daemon's next call is answered
401 ``unknown_session``, on which it registers again (leases are bound to the daemon id, so they
survive). A session lapses ``ttl_seconds`` after its last call (401 ``session_expired``).

A daemon id has one live session. Registering it again from the same node with a bootstrap
token of the same scope replaces the old session (a restarted daemon keeps its id and must get
back in), but nothing of the old session is handed over: the caller releases its leases back to
the queue (:attr:`Registered.replaced`), so a new session never completes, renews or reports as
the work of the one it replaced. A live session on another node, or registered with a token of
another scope, is not replaced (409 ``daemon_id_in_use``). The holder of the bootstrap token is
trusted for the identity it declares; what a session prevents is one daemon acting as another,
or outside the namespaces it registered for.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass

from nymph.queue.errors import Conflict, ServiceError
from nymph.queue.models import DaemonSession, Principal, Role, SessionSettings

SESSION_PREFIX = "nyd_"


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


class SessionStore:
    def __init__(self, *, settings: SessionSettings) -> None:
        self._settings = settings
        #: credential hash -> (session, expiry on the monotonic clock)
        self._by_hash: dict[str, tuple[DaemonSession, float]] = {}
        #: daemon id -> credential hash of its live session
        self._by_daemon: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._by_hash)

    def _drop(self, digest: str) -> None:
        entry = self._by_hash.pop(digest, None)
        if entry is not None and self._by_daemon.get(entry[0].daemon_id) == digest:
            del self._by_daemon[entry[0].daemon_id]

    def _purge(self, now: float) -> None:
        for digest in [d for d, (_, exp) in self._by_hash.items() if exp <= now]:
            self._drop(digest)

    def register(
        self, *, bootstrap: Principal, daemon_id: str, node: str, namespaces: tuple[str, ...]
    ) -> Registered:
        now = time.monotonic()
        old = self._by_daemon.get(daemon_id)
        replaced: DaemonSession | None = None
        if old is not None:
            live, expires = self._by_hash[old]
            if expires > now:
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
            self._drop(old)
        if len(self._by_hash) >= self._settings.max_sessions:
            self._purge(now)
            if len(self._by_hash) >= self._settings.max_sessions:
                raise TooManySessions(
                    f"{len(self._by_hash)} daemon sessions are live, the most the queue keeps: "
                    "retry once idle ones have lapsed"
                )
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
        expires = now + self._settings.ttl_seconds
        self._by_hash[digest] = (session, expires)
        self._by_daemon[daemon_id] = digest
        return Registered(
            credential=credential,
            session=session,
            expires_at=time.time() + self._settings.ttl_seconds,
            replaced=replaced,
        )

    def authenticate(self, credential: str) -> tuple[DaemonSession | None, bool]:
        """(the session, False) for a live credential, extending it; (None, True) for a lapsed
        one; (None, False) for one never issued (or issued before a restart, or replaced)."""
        digest = _digest(credential)
        entry = self._by_hash.get(digest)
        if entry is None:
            return None, False
        session, expires = entry
        now = time.monotonic()
        if expires <= now:
            self._drop(digest)
            return None, True
        self._by_hash[digest] = (session, now + self._settings.ttl_seconds)
        return session, False


def session_principal(session: DaemonSession) -> Principal:
    """The caller of a dispatch route: the session's daemon, with its bootstrap token's scope."""
    return Principal(
        token_id=session.session_id,
        role=Role.DAEMON,
        namespace=session.scope,
        name=f"daemon {session.daemon_id}",
        session=session,
    )
