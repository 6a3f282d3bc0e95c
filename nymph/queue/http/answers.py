"""The queue's JSON answers, encoded by orjson (:mod:`nymph.fastjson`): every launch, claim,
report and completion is answered with one, and the standard library's encoder was a few per
cent of the queue's CPU."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from nymph import fastjson


def json_response(data: Any, *, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    """``data`` as a JSON answer, as :func:`aiohttp.web.json_response` makes it."""
    return web.json_response(data, status=status, headers=headers, dumps=fastjson.dumps_text)
