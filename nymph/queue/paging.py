"""Paged lists (pure): the ``limit`` of a page, and the opaque ``continue`` token that says where
the next page starts.

A list is read in a stable order (instances by ``(launched_at, instance_id)``, secrets by name,
...) and each page starts strictly after the sort key of the last row the previous page read
(keyset pagination): rows added meanwhile never shift a page, so no row that existed when the
listing began is repeated or skipped. The token carries that key, the list it belongs to and a
digest of the filters it was made for, with a checksum: a token that was cut, edited or made
for another list or filter is refused (a 400 saying to start the listing again without it). It
is not a secret: the scope of a listing (namespace, provider) is in the route and the token,
so an edited token could only start a page elsewhere in what the caller may list anyway.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from nymph.queue.errors import BadRequest

DEFAULT_LIMIT = 500
MAX_LIMIT = 5_000
#: The longest ``continue`` token read (a key of a few short values is far below it).
MAX_TOKEN_LEN = 2_048
_SALT = b"nymph-page-v1"

#: A sort key: the values of the order's columns for one row (strings, numbers).
Key = tuple[str | int | float, ...]
T = TypeVar("T")


@dataclass(frozen=True)
class PageRequest:
    """Which page: at most ``limit`` rows after ``after`` (None: from the start)."""

    limit: int = DEFAULT_LIMIT
    after: Key | None = None


@dataclass(frozen=True)
class Page(Generic[T]):
    """Rows of one page and, when more may follow, the key of the last row read."""

    items: list[T]
    next_key: Key | None = None


def parse_limit(raw: str | None) -> int:
    """The ``limit`` query parameter: absent or empty is the default, else 1..MAX_LIMIT."""
    if raw is None or raw == "":
        return DEFAULT_LIMIT
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(
            f"query parameter limit={raw[:40]!r} is not an integer: give 1 to {MAX_LIMIT} "
            f"(default {DEFAULT_LIMIT})",
            code="invalid_query",
        ) from None
    if not 1 <= value <= MAX_LIMIT:
        raise BadRequest(
            f"query parameter limit must be between 1 and {MAX_LIMIT} (default {DEFAULT_LIMIT}); got {value}",
            code="invalid_query",
        )
    return value


def _digest(filters: Sequence[str | None]) -> str:
    return hashlib.sha256(json.dumps(list(filters)).encode()).hexdigest()[:16]


def _check(payload: bytes) -> str:
    return hashlib.sha256(_SALT + payload).hexdigest()[:16]


def encode_token(*, listing: str, filters: Sequence[str | None], key: Key) -> str:
    """The ``continue`` token of a page of ``listing`` (with these filters) ending at ``key``."""
    payload = json.dumps(
        {"l": listing, "f": _digest(filters), "k": list(key)}, separators=(",", ":")
    ).encode()
    body = base64.urlsafe_b64encode(payload).decode().rstrip("=")
    return f"{body}.{_check(payload)}"


def _refuse(why: str) -> BadRequest:
    return BadRequest(
        f"query parameter continue {why}: start the listing again without continue",
        code="invalid_continue",
    )


def decode_token(token: str, *, listing: str, filters: Sequence[str | None], arity: int) -> Key:
    """The key a token from :func:`encode_token` carries, checked against the listing and its
    filters; BadRequest (``invalid_continue``) for anything else."""
    if len(token) > MAX_TOKEN_LEN or "." not in token:
        raise _refuse("is not a token this queue gave")
    body, _, check = token.rpartition(".")
    try:
        payload = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    except (binascii.Error, ValueError):
        raise _refuse("is not a token this queue gave") from None
    if _check(payload) != check:
        raise _refuse("was altered or cut")
    try:
        data: Any = json.loads(payload)
    except ValueError:
        raise _refuse("is not a token this queue gave") from None
    if not isinstance(data, dict) or data.get("l") != listing:
        raise _refuse("belongs to another list")
    if data.get("f") != _digest(filters):
        raise _refuse("was made for other filters (keep the same query parameters while paging)")
    key = data.get("k")
    if (
        not isinstance(key, list)
        or len(key) != arity
        or not all(isinstance(v, str | int | float) and not isinstance(v, bool) for v in key)
    ):
        raise _refuse("is not a token this queue gave")
    return tuple(key)


def page_of(rows: Sequence[T], *, limit: int, key_of: Callable[[T], Key]) -> Page[T]:
    """A page from ``rows`` read with ``LIMIT limit + 1``: the extra row only says more follow."""
    if len(rows) <= limit:
        return Page(items=list(rows))
    kept = list(rows[:limit])
    return Page(items=kept, next_key=key_of(kept[-1]))
