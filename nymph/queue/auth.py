"""Bearer tokens: creation, import and lookup (the middleware that enforces role and namespace
scope is in :mod:`nymph.queue.http.middlewares`).

A token is shown once, when created, and stored only as its sha256 hash. Callers are known by
the token's id (``tok-<hex>``) and optional name, which is what gets recorded as requester and
logged; the token itself never is.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass

from nymph.launch import names
from nymph.queue.db import Backend
from nymph.queue.models import Principal, Role
from nymph.queue.sql.dialect import Conn

TOKEN_PREFIX = "nyq_"  # noqa: S105 - a prefix, not a secret


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", errors="surrogatepass")).hexdigest()


@dataclass(frozen=True)
class CreatedToken:
    token_id: str
    token: str
    role: Role
    namespace: str | None
    name: str | None


def create_token(
    conn: Conn, *, role: Role, namespace: str | None = None, name: str | None = None
) -> CreatedToken:
    """Insert a new token (hash only) inside the caller's transaction; return it once."""
    if namespace is not None:
        names.check_namespace(namespace, field="--namespace")
    if role is Role.ADMIN and namespace is not None:
        raise ValueError("an admin token is for every namespace: leave out --namespace")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token_id = "tok-" + secrets.token_hex(6)
    conn.execute(
        "INSERT INTO tokens (id, hash, role, namespace, name, created_at) VALUES (?, ?, ?, ?, ?, ?)",
        (token_id, hash_token(token), role.value, namespace, name, time.time()),
    )
    return CreatedToken(token_id=token_id, token=token, role=role, namespace=namespace, name=name)


def import_token(
    conn: Conn, *, token: str, role: Role, namespace: str | None = None, name: str | None = None
) -> bool:
    """Make a token chosen elsewhere (e.g. a Kubernetes Secret shared with the daemons) valid.

    Idempotent: importing the same token again changes nothing. Returns True if it was new.
    """
    if len(token) < 20 or not token.isprintable() or any(c.isspace() for c in token):
        raise ValueError("an imported token must be at least 20 printable characters without spaces")
    digest = hash_token(token)
    # The insert is the check (replicas starting at once import the same tokens).
    cur = conn.execute(
        "INSERT INTO tokens (id, hash, role, namespace, name, created_at) VALUES (?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (hash) DO NOTHING",
        ("tok-" + secrets.token_hex(6), digest, role.value, namespace, name or "imported", time.time()),
    )
    return bool(cur.rowcount)


def _lookup(conn: Conn, digest: str) -> Principal | None:
    row = conn.execute("SELECT id, role, namespace, name FROM tokens WHERE hash = ?", (digest,)).fetchone()
    if row is None:
        return None
    return Principal(token_id=row["id"], role=Role(row["role"]), namespace=row["namespace"], name=row["name"])


class Authenticator:
    """Resolves bearer tokens to principals, caching known ones for a short while."""

    def __init__(self, *, db: Backend, cache_seconds: float) -> None:
        self._db = db
        self._cache_seconds = cache_seconds
        self._cache: dict[str, tuple[Principal, float]] = {}

    async def authenticate(self, token: str) -> Principal | None:
        digest = hash_token(token)
        hit = self._cache.get(digest)
        now = time.monotonic()
        if hit is not None and hit[1] > now:
            return hit[0]
        principal = await self._db.read_one(lambda conn: _lookup(conn, digest))
        if principal is not None:
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[digest] = (principal, now + self._cache_seconds)
        return principal
