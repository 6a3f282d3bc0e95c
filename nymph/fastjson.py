"""Decoding the JSON the API server sends (a Pod's document at every change a watch reports,
and the answers of the API calls), and encoding what is sent to it (a Pod's manifest).

orjson decodes a Pod's document in well under half the standard library's time, and a daemon
decodes several per launch. What orjson refuses but JSON allows (a lone surrogate escape) goes
to the standard library, and what is not JSON at all is refused with a :class:`ValueError`
either way. The one difference: orjson reads an integer past 64 bits as a float. Kubernetes'
types hold no such integer (its integer fields are int32 or int64), so no document of the
API server's has one; this module is for those documents only.
"""

from __future__ import annotations

import json
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


def loads(data: str | bytes) -> Any:
    """``data`` decoded, as :func:`json.loads` would."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)
