"""Providers and modes of each namespace (synchronous SQL inside the caller's transaction)."""

from __future__ import annotations

import functools
import json
from typing import Any

from nymph.errors import ValidationError
from nymph.launch.config import Mode, Provider
from nymph.launch.names import check_namespace
from nymph.protocol import now
from nymph.queue.errors import BadRequest, Conflict, NotFound
from nymph.queue.sql.dialect import Conn, Row

PROVIDER_BODY = "SELECT body FROM providers WHERE namespace = ? AND name = ?"
MODE_BODY = "SELECT body FROM modes WHERE namespace = ? AND name = ?"


def get_provider(conn: Conn, *, ns: str, name: str) -> Provider:
    return provider_of(conn.execute(PROVIDER_BODY, (ns, name)).fetchone(), ns=ns, name=name)


def provider_of(row: Row | None, *, ns: str, name: str) -> Provider:
    """The provider read by :data:`PROVIDER_BODY` (NotFound when there is none)."""
    return provider_from(None if row is None else row[0], ns=ns, name=name)


def provider_from(text: str | None, *, ns: str, name: str) -> Provider:
    """The provider whose stored body is ``text`` (NotFound when there is none)."""
    if text is None:
        raise NotFound(
            f"no provider {name!r} in namespace {ns!r}: create it with 'nymph providers add'",
            code="provider_not_found",
        )
    return _stored_provider(text)


# A launch reads its provider and mode: each stored body is parsed and checked once while it is
# among the last few read (they are immutable: a changed body is another text).
@functools.lru_cache(maxsize=256)
def _stored_provider(text: str) -> Provider:
    body = json.loads(text)
    return Provider(
        name=body["name"], kwargs=body["kwargs"], launcher=body["launcher"], dispatch=body["dispatch"]
    )


@functools.lru_cache(maxsize=256)
def _stored_mode(text: str) -> Mode:
    body = json.loads(text)
    return Mode(name=body["name"], provider=body["provider"], fields=body["fields"])


def kube_namespace(provider: Provider) -> str:
    """The provider's kube namespace, checked; a :class:`BadRequest` if it is not a valid one."""
    try:
        return check_namespace(provider.namespace, field="provider.namespace")
    except ValidationError as exc:
        raise BadRequest(str(exc), code="invalid_provider") from None


def put_provider(conn: Conn, *, ns: str, provider: Provider, replace: bool) -> dict[str, Any]:
    body = provider.to_json()
    ts = now()
    # A create is the insert itself (two creates of one name at once: one gets the 409).
    cur = conn.execute(
        "INSERT INTO providers (namespace, name, body, created_at, updated_at) "
        "VALUES (?, ?, ?, ?, ?) ON CONFLICT (namespace, name) "
        + (
            "DO UPDATE SET body = excluded.body, updated_at = excluded.updated_at"
            if replace
            else "DO NOTHING"
        ),
        (ns, provider.name, json.dumps(body), ts, ts),
    )
    if not replace and not cur.rowcount:
        raise Conflict(
            f"provider {provider.name!r} already exists in namespace {ns!r}: delete it "
            "first or PUT to replace it",
            code="provider_exists",
        )
    return body


def list_providers(conn: Conn, *, ns: str) -> list[dict[str, Any]]:
    rows = conn.execute("SELECT body FROM providers WHERE namespace = ? ORDER BY name", (ns,)).fetchall()
    return [json.loads(r[0]) for r in rows]


def delete_provider(conn: Conn, *, ns: str, name: str) -> None:
    cur = conn.execute("DELETE FROM providers WHERE namespace = ? AND name = ?", (ns, name))
    if not cur.rowcount:
        get_provider(conn, ns=ns, name=name)


def get_mode(conn: Conn, *, ns: str, name: str) -> Mode:
    return mode_of(conn.execute(MODE_BODY, (ns, name)).fetchone(), ns=ns, name=name)


def mode_of(row: Row | None, *, ns: str, name: str) -> Mode:
    """The mode read by :data:`MODE_BODY` (NotFound when there is none)."""
    return mode_from(None if row is None else row[0], ns=ns, name=name)


def mode_from(text: str | None, *, ns: str, name: str) -> Mode:
    """The mode whose stored body is ``text`` (NotFound when there is none)."""
    if text is None:
        raise NotFound(
            f"no mode {name!r} in namespace {ns!r}: create it with 'nymph modes add'",
            code="mode_not_found",
        )
    return _stored_mode(text)


def mode_for(conn: Conn, *, ns: str, provider: Provider, mode_name: str) -> Mode:
    """The mode, which must belong to ``provider`` or to no provider."""
    return checked_mode(get_mode(conn, ns=ns, name=mode_name), provider=provider)


def checked_mode(mode: Mode, *, provider: Provider) -> Mode:
    """``mode``, which must belong to ``provider`` or to no provider (a BadRequest)."""
    if mode.provider not in (None, provider.name):
        raise BadRequest(
            f"mode {mode.name!r} belongs to provider {mode.provider!r}, not {provider.name!r}: "
            "launch it on that provider or pick another mode",
            code="mode_provider_mismatch",
        )
    return mode


def put_mode(conn: Conn, *, ns: str, mode: Mode, replace: bool) -> dict[str, Any]:
    body = mode.to_json()
    if mode.provider is not None:
        row = conn.execute(
            "SELECT 1 FROM providers WHERE namespace = ? AND name = ?", (ns, mode.provider)
        ).fetchone()
        if row is None:
            raise BadRequest(
                f"mode {mode.name!r} names provider {mode.provider!r}, which does not "
                f"exist in namespace {ns!r}: create the provider first",
                code="unknown_provider",
            )
    ts = now()
    cur = conn.execute(
        "INSERT INTO modes (namespace, name, provider, body, created_at, updated_at) "
        "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (namespace, name) "
        + (
            "DO UPDATE SET provider = excluded.provider, body = excluded.body, updated_at = excluded.updated_at"
            if replace
            else "DO NOTHING"
        ),
        (ns, mode.name, mode.provider, json.dumps(body), ts, ts),
    )
    if not replace and not cur.rowcount:
        raise Conflict(
            f"mode {mode.name!r} already exists in namespace {ns!r}: delete it first or PUT to replace it",
            code="mode_exists",
        )
    return body


def list_modes(conn: Conn, *, ns: str) -> list[dict[str, Any]]:
    rows = conn.execute("SELECT body FROM modes WHERE namespace = ? ORDER BY name", (ns,)).fetchall()
    return [json.loads(r[0]) for r in rows]


def delete_mode(conn: Conn, *, ns: str, name: str) -> None:
    cur = conn.execute("DELETE FROM modes WHERE namespace = ? AND name = ?", (ns, name))
    if not cur.rowcount:
        get_mode(conn, ns=ns, name=name)


def namespaces(conn: Conn, *, limit: int) -> list[str]:
    """The namespaces that hold a provider or a mode, by name (the first ``limit``)."""
    rows = conn.execute(
        "SELECT namespace FROM providers UNION SELECT namespace FROM modes ORDER BY namespace LIMIT ?",
        (limit,),
    ).fetchall()
    return [str(r[0]) for r in rows]
