"""Reading request bodies and query strings into checked values.

Malformed JSON is a 400; a body that is JSON but has the wrong shape (not an object, a missing
key, a value of the wrong type) is a 422 naming the key; a body over the size cap (before or
after decoding) is a 413. A ``Content-Encoding`` of ``gzip`` or ``deflate`` is decoded here (the
server leaves bodies encoded, see :mod:`nymph.queue.http.server`): a body that does not decode is a
400, any other encoding a 415.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Collection, Mapping
from typing import Any

from aiohttp import web

from nymph.queue.errors import BadRequest, PayloadTooLarge, Unprocessable, UnsupportedMediaType

_MISSING = object()


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    """A JSON number as a float; one too large for a float (``1e400``) is refused like
    ``Infinity``, not read as it."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("a number too large for a float")
    return value


#: Content codings a request body may use (applied in the order the header lists them).
ENCODINGS = ("identity", "gzip", "x-gzip", "deflate")


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"the request body is larger than {limit} bytes: send less "
        "(scripts are capped at 120 KiB; put large code in the image)",
    )


def _inflate(data: bytes, *, wbits: int, limit: int) -> bytes:
    inflater = zlib.decompressobj(wbits=wbits)
    out = inflater.decompress(data, limit + 1)
    if len(out) > limit or inflater.unconsumed_tail:
        raise _too_large(limit)
    if not inflater.eof or inflater.unused_data:
        raise zlib.error("truncated or trailing data")
    return out


def decode_body(raw: bytes, *, content_encoding: str, limit: int) -> bytes:
    """``raw`` with its content codings undone; 415 for an unknown one, 400 for a corrupt body,
    413 when the decoded body exceeds ``limit`` bytes (a decompression bomb stops there)."""
    codings = [c.strip().lower() for c in content_encoding.split(",") if c.strip()]
    unknown = [c for c in codings if c not in ENCODINGS]
    if unknown:
        raise UnsupportedMediaType(
            f"Content-Encoding {unknown[0][:40]!r} is not supported: send the body plain or with "
            f"one of {', '.join(ENCODINGS)}",
            code="unsupported_encoding",
        )
    data = raw
    for coding in reversed(codings):
        try:
            if coding in ("gzip", "x-gzip"):
                data = _inflate(data, wbits=16 + zlib.MAX_WBITS, limit=limit)
            elif coding == "deflate":
                # RFC 9110 deflate is zlib-wrapped; some clients send raw deflate.
                try:
                    data = _inflate(data, wbits=zlib.MAX_WBITS, limit=limit)
                except zlib.error:
                    data = _inflate(data, wbits=-zlib.MAX_WBITS, limit=limit)
        except zlib.error:
            raise BadRequest(
                f"the request body does not decode as Content-Encoding {coding}: send it plain "
                "or encode it correctly",
                code="invalid_encoding",
            ) from None
    return data


async def read_object(
    request: web.Request, *, allow_empty: bool = False, limit: int | None = None
) -> dict[str, Any]:
    """The body as a JSON object; ``limit``: this route's body cap in bytes, instead of the
    app's."""
    if limit is not None:
        request = request.clone(client_max_size=limit)
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise _too_large(request.client_max_size) from None
    encoding = request.headers.get("Content-Encoding", "")
    if encoding:
        raw = decode_body(raw, content_encoding=encoding, limit=request.client_max_size)
    if not raw.strip():
        if allow_empty:
            return {}
        raise Unprocessable("the request needs a JSON object body", code="missing_body")
    try:
        data = json.loads(raw, parse_constant=_no_constants, parse_float=_finite)
        if b"\\u" in raw:  # only escapes can smuggle in unpaired surrogates
            json.dumps(data, ensure_ascii=False).encode("utf-8")
    except (ValueError, UnicodeError, RecursionError):
        raise BadRequest(
            "the request body is not valid JSON (or holds NaN, Infinity, a number too large for a "
            "float, unpaired surrogates or absurd nesting): send a plain JSON object",
            code="invalid_json",
        ) from None
    if not isinstance(data, dict):
        raise Unprocessable("the request body must be a JSON object, not a list or scalar")
    return data


class Fields:
    """Typed access to the keys of a JSON object; every error names the key."""

    def __init__(self, data: Mapping[str, Any], *, where: str = "body") -> None:
        self.data = data
        self.where = where

    def _fail(self, key: str, what: str) -> Unprocessable:
        return Unprocessable(f"{self.where}.{key} {what}")

    def reject_unknown(self, allowed: Collection[str]) -> None:
        unknown = sorted(set(self.data) - set(allowed))
        if unknown:
            raise self._fail(unknown[0], f"is not a known key; use {', '.join(sorted(allowed))}")

    def _get(self, key: str, required: bool) -> Any:
        value = self.data.get(key, _MISSING)
        if value is _MISSING or value is None:
            if required:
                raise self._fail(key, "is required")
            return _MISSING
        return value

    def string(self, key: str, *, required: bool = True, max_len: int = 253) -> str | None:
        value = self._get(key, required)
        if value is _MISSING:
            return None
        if not isinstance(value, str):
            raise self._fail(key, "must be a string")
        if required and not value.strip():
            raise self._fail(key, "must not be empty")
        if len(value) > max_len:
            raise self._fail(key, f"is longer than {max_len} characters")
        return value

    def req_string(self, key: str, *, max_len: int = 253) -> str:
        value = self.string(key, required=True, max_len=max_len)
        assert value is not None
        return value

    def text(self, key: str, *, required: bool = True) -> str | None:
        """A string of any length (logs, errors)."""
        return self.string(key, required=required, max_len=1 << 30)

    def integer(
        self, key: str, *, default: int | None = None, minimum: int = 0, maximum: int | None = None
    ) -> int:
        value = self._get(key, default is None)
        if value is _MISSING:
            assert default is not None
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._fail(key, "must be an integer")
        if value < minimum or (maximum is not None and value > maximum):
            bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
            raise self._fail(key, f"must be {bound}")
        return value

    def number(self, key: str, *, default: float, minimum: float, maximum: float) -> float:
        value = self._get(key, False)
        if value is _MISSING:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self._fail(key, "must be a number")
        if not minimum <= value <= maximum:
            raise self._fail(key, f"must be between {minimum:g} and {maximum:g}")
        return float(value)

    def boolean(self, key: str, *, default: bool | None = None) -> bool:
        value = self._get(key, default is None)
        if value is _MISSING:
            assert default is not None
            return default
        if not isinstance(value, bool):
            raise self._fail(key, "must be true or false")
        return value

    def mapping(self, key: str, *, required: bool = False) -> dict[str, Any] | None:
        value = self._get(key, required)
        if value is _MISSING:
            return None
        if not isinstance(value, dict):
            raise self._fail(key, "must be a JSON object")
        return value

    def strings(self, key: str, *, required: bool = True, max_items: int = 10_000) -> list[str]:
        value = self._get(key, required)
        if value is _MISSING:
            return []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self._fail(key, "must be a list of strings")
        if len(value) > max_items:
            raise self._fail(key, f"has more than {max_items} items")
        return value

    def objects(self, key: str, *, max_items: int = 10_000) -> list[dict[str, Any]]:
        value = self._get(key, True)
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise self._fail(key, "must be a list of JSON objects")
        if len(value) > max_items:
            raise self._fail(key, f"has more than {max_items} items")
        return value


def query_number(
    request: web.Request, key: str, *, default: float | None, minimum: float, maximum: float
) -> float | None:
    raw = request.query.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise BadRequest(f"query parameter {key}={raw!r} is not a number", code="invalid_query") from None
    if not math.isfinite(value) or not minimum <= value <= maximum:
        raise BadRequest(
            f"query parameter {key} must be between {minimum:g} and {maximum:g}", code="invalid_query"
        )
    return value


def query_int(request: web.Request, key: str, *, minimum: int, maximum: int) -> int | None:
    raw = request.query.get(key)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"query parameter {key}={raw!r} is not an integer", code="invalid_query") from None
    if not minimum <= value <= maximum:
        raise BadRequest(
            f"query parameter {key} must be between {minimum} and {maximum}", code="invalid_query"
        )
    return value


def query_flag(request: web.Request, key: str) -> bool | None:
    """A true/false query parameter (None when absent or empty)."""
    raw = request.query.get(key)
    if raw is None or raw == "":
        return None
    if raw.lower() in ("true", "1", "yes"):
        return True
    if raw.lower() in ("false", "0", "no"):
        return False
    raise BadRequest(f"query parameter {key}={raw[:40]!r} must be true or false", code="invalid_query")


#: The longest Idempotency-Key header accepted.
MAX_IDEMPOTENCY_KEY_LEN = 255


def idempotency_key(request: web.Request) -> str | None:
    key = request.headers.get("Idempotency-Key")
    if key is None:
        return None
    if not key or len(key) > MAX_IDEMPOTENCY_KEY_LEN or not key.isprintable():
        raise BadRequest(
            f"Idempotency-Key must be 1-{MAX_IDEMPOTENCY_KEY_LEN} printable characters (a UUID is ideal)",
            code="invalid_idempotency_key",
        )
    return key
