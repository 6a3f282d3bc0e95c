"""Idempotency-Key: a launch sent again with the same key and body gets the first 202 body back;
the same key with another body is a 409 (synchronous SQL inside the launch's transaction)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from nymph.protocol import LaunchAccepted
from nymph.queue.errors import Conflict
from nymph.queue.sql.dialect import Conn


def body_digest(body: Mapping[str, Any]) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8", errors="surrogatepass")).hexdigest()


def replay(conn: Conn, *, ns: str, provider: str, key: str | None, digest: str) -> LaunchAccepted | None:
    """The 202 body a launch sent earlier with this Idempotency-Key, if any (same body only)."""
    replay: LaunchAccepted | None = replay_json(conn, ns=ns, provider=provider, key=key, digest=digest)
    return replay


def replay_json(conn: Conn, *, ns: str, provider: str, key: str | None, digest: str) -> Any:
    """The 202 body (a launch's or a launch group's) sent earlier with this Idempotency-Key,
    if any (same body only)."""
    if key is None:
        return None
    row = conn.execute(
        "SELECT body_sha256, response FROM idempotency_keys WHERE namespace = ? AND provider = ? AND key = ?",
        (ns, provider, key),
    ).fetchone()
    if row is None:
        return None
    if row["body_sha256"] != digest:
        raise Conflict(
            "this Idempotency-Key was already used for a different launch body: use a "
            "new key for a new launch",
            code="idempotency_key_reused",
        )
    return json.loads(row["response"])


def remember(
    conn: Conn,
    *,
    ns: str,
    provider: str,
    key: str | None,
    digest: str,
    accepted: LaunchAccepted,
    ts: float,
) -> None:
    remember_json(
        conn,
        ns=ns,
        provider=provider,
        key=key,
        digest=digest,
        owner=accepted["instanceId"],
        response=accepted,
        ts=ts,
    )


def remember_json(
    conn: Conn,
    *,
    ns: str,
    provider: str,
    key: str | None,
    digest: str,
    owner: str,
    response: Any,
    ts: float,
) -> None:
    """Remember ``response`` under the key; ``owner``: the instance (or group) it answered for."""
    if key is not None:
        conn.execute(
            "INSERT INTO idempotency_keys (namespace, provider, key, body_sha256, instance_id, "
            "response, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (ns, provider, key, digest, owner, json.dumps(response), ts),
        )
