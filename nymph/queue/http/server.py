"""The HTTP server around the queue app: errors aiohttp's parser raises before any middleware
runs (an unknown method, a malformed request line or header) answered in the documented
``{"error", "detail"}`` shape, and request bodies left encoded so that
:func:`nymph.queue.http.bodies.read_object` decodes them itself (a corrupt or unknown
``Content-Encoding`` is then a 4xx, never a 500).

Every server of the queue app is started through :func:`make_runner`.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMethod
from aiohttp.web_request import BaseRequest

#: Parser errors by status: (code, detail).
_PARSER_ERRORS = {
    400: ("bad_request", "the request is not valid HTTP/1.1"),
    405: ("method_not_allowed", "this method is not used by the queue API: see GET /openapi.yaml"),
    413: ("too_large", "a request line or header is too large"),
    431: ("too_large", "the request headers are too large"),
}


class _Handler(web.RequestHandler):
    """A connection handler whose own error answers are JSON (and never a traceback)."""

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0 or status >= 500:
            # aiohttp logs it (and refuses to answer twice); the answer shows no internals.
            super().handle_error(request, status, exc, None)
            code, detail = "internal", "the queue hit an unexpected error: see its log"
            status = max(status, 500)
        else:
            if isinstance(exc, BadHttpMethod):
                status = 405
            status = status if status in _PARSER_ERRORS else 400
            code, detail = _PARSER_ERRORS[status]
        resp = web.Response(
            status=status, text=json.dumps({"error": code, "detail": detail}), content_type="application/json"
        )
        resp.force_close()
        return resp


class _Server(web.Server):
    def __call__(self) -> web.RequestHandler:
        return _Handler(self, loop=self._loop, **self._kwargs)


class _Runner(web.AppRunner):
    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        return _Server(
            server.request_handler,
            request_factory=server.request_factory,
            handler_cancellation=server.handler_cancellation,
            loop=server._loop,
            **server._kwargs,
        )


def make_runner(app: web.Application, **kwargs: Any) -> web.AppRunner:
    """An AppRunner for the queue app: JSON parser errors, bodies decoded by the app."""
    return _Runner(app, auto_decompress=False, **kwargs)
