"""JSON by orjson, on the hot paths: the API server's documents (a Pod's at every change a watch
reports, the answers of API calls, a Pod's manifest sent), the queue's answers and stored task
specs, and the log lines of every process.

orjson encodes and decodes in well under half the standard library's time. What orjson
refuses but JSON allows (a lone surrogate escape, an integer past 64 bits, a key that is not a
string) goes to the standard library, and what is not JSON at all is refused with a
:class:`ValueError` either way. The differences that remain:

- decoding, orjson reads an integer past 64 bits as a float. Kubernetes' types hold no such
  integer (int32 or int64), and the queue decodes request bodies with the standard library
  (:mod:`nymph.queue.http.bodies`); what must read such an integer back exactly uses
  :func:`json.loads`;
- encoding, orjson writes NaN and infinity as ``null`` where the standard library writes
  ``NaN`` (which is not JSON). The queue refuses a request body that holds one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson


def dumps(obj: Any) -> bytes:
    """``obj`` as compact JSON bytes (UTF-8, as the API server takes it); what orjson cannot
    encode (an integer past 64 bits, a key that is not a string) goes to the standard library,
    which encodes it or raises as it always has."""
    try:
        return orjson.dumps(obj)
    except TypeError:
        return json.dumps(obj, separators=(",", ":")).encode()


def dumps_text(obj: Any, default: Callable[[Any], Any] | None = None) -> str:
    """:func:`dumps` as text; ``default`` turns what JSON cannot hold into what it can (as
    :func:`json.dumps`'s)."""
    try:
        return orjson.dumps(obj, default=default).decode()
    except TypeError:
        return json.dumps(obj, separators=(",", ":"), default=default)


def canonical(obj: Any) -> bytes:
    """``obj`` with sorted keys, no spaces and text unescaped, byte for byte what
    ``json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)`` encodes to
    UTF-8 (what a hash is taken of, so it may never change). orjson writes that same text for
    strings, integers, booleans, null, lists and string-keyed objects (UTF-8 orders keys as
    code points do); a float (written otherwise: ``1e-05`` against ``1e-5``), or anything else,
    goes to the standard library."""
    if _plain(obj):
        try:
            return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)
        except TypeError:  # an integer past 64 bits, a lone surrogate
            pass
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _plain(obj: Any) -> bool:
    kind = type(obj)
    if kind is str or kind is int or kind is bool or obj is None:
        return True
    if kind is dict:
        return all(type(k) is str and _plain(v) for k, v in obj.items())
    if kind is list or kind is tuple:
        return all(_plain(v) for v in obj)
    return False


def loads(data: str | bytes) -> Any:
    """``data`` decoded, as :func:`json.loads` would."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)
