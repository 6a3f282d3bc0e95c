"""The service's middlewares, outermost first: errors to JSON bodies, then bearer-token auth.

``error_middleware`` turns a :class:`ServiceError` (and aiohttp's own 4xx) into
``{"error": code, "detail": text}`` and anything unexpected into a logged 500 that shows no
internals. ``auth_middleware`` resolves the bearer token (or a daemon's session credential, see
:mod:`nymph.queue.sessions`) to a :class:`Principal`, checks its role and namespace scope and
that the URL's namespace is a DNS-1123 label; the credential itself is never logged.

Who may call what: user routes take user tokens only; ``POST /v1/dispatch/register`` takes the
daemon bootstrap token only; every other dispatch route takes a daemon session only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog
from aiohttp import web

from nymph.errors import ValidationError
from nymph.launch import names
from nymph.queue.errors import BadRequest, Forbidden, ServiceError, Unauthorized
from nymph.queue.http.answers import json_response
from nymph.queue.http.keys import AUTH, PRINCIPAL, SESSIONS
from nymph.queue.models import Principal, Role
from nymph.queue.secrets import SecretKeyError
from nymph.queue.sessions import SESSION_PREFIX, session_principal

log = structlog.get_logger(__name__, component="queue.middlewares")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

PUBLIC_ROUTES = frozenset(
    (method, path) for method in ("GET", "HEAD") for path in ("/healthz", "/openapi.yaml")
)
REGISTER_PATH = "/v1/dispatch/register"
CONSOLE_PREFIX = "/console"


def is_console_path(path: str) -> bool:
    return path == CONSOLE_PREFIX or path.startswith(CONSOLE_PREFIX + "/")


_HTTP_CODES = {
    400: ("bad_request", "the request is malformed"),
    404: ("not_found", "no such route: see GET /openapi.yaml for the API"),
    405: ("method_not_allowed", "this route does not take that method: see GET /openapi.yaml"),
    413: ("too_large", "the request body is too large: send less"),
    415: ("unsupported_encoding", "the request body's encoding is not supported"),
}


def error_body(*, code: str, detail: str) -> dict[str, str]:
    return {"error": code, "detail": detail}


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ServiceError as exc:
        return json_response(error_body(code=exc.code, detail=exc.detail), status=exc.status)
    except SecretKeyError as exc:
        # The queue's own set-up (its secret key file), which its operator must fix: say what.
        log.error("secret key problem", method=request.method, path=request.path, detail=str(exc))
        return json_response(error_body(code="secret_key", detail=str(exc)), status=500)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code, detail = _HTTP_CODES.get(exc.status, ("http_error", exc.reason))
        headers = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
        return json_response(error_body(code=code, detail=detail), status=exc.status, headers=headers)
    except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
        raise
    except Exception:
        log.exception("unhandled error", method=request.method, path=request.path)
        return json_response(
            error_body(code="internal", detail="the queue hit an unexpected error: see its log"),
            status=500,
        )


def _bearer(request: web.Request) -> str:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized(
            "send 'Authorization: Bearer <token>'; create a token with "
            "'nymph queue token create --role user' on the queue host",
            code="missing_token",
        )
    return token


def _check_scope(request: web.Request, principal: Principal) -> None:
    path = request.path
    if path.startswith("/v1/dispatch/") or path == "/v1/dispatch":
        if principal.role is not Role.DAEMON:
            raise Forbidden(
                "the dispatch API is for nymph daemons: use a token created with --role daemon",
                code="wrong_role",
            )
        if path == REGISTER_PATH and principal.session is not None:
            raise Forbidden("register with the daemon bootstrap token, not with a session", code="wrong_role")
        if path != REGISTER_PATH and principal.session is None:
            raise Unauthorized(
                f"dispatch calls need a daemon session: register first (POST {REGISTER_PATH} "
                "with this token) and send the session credential it returns",
                code="session_required",
            )
        return
    check_user_scope(principal, request.match_info.get("ns"))


def check_user_scope(principal: Principal, ns: str | None) -> None:
    """A user route for namespace ``ns`` (None: no namespace in the route): the principal is a
    user or admin token that may touch ``ns``, and ``ns`` is a DNS-1123 label. The console's
    pages are held to this same check."""
    if principal.role is Role.DAEMON:
        raise Forbidden(
            "daemon credentials cannot use the user API: use a token created with --role user",
            code="wrong_role",
        )
    if ns is None:
        return
    try:
        names.check_namespace(ns, field="namespace")
    except ValidationError as exc:
        raise BadRequest(f"{exc}", code="invalid_namespace") from None
    if not principal.may_touch(ns):
        raise Forbidden(
            f"this token is scoped to namespace {principal.namespace!r} and cannot use "
            f"namespace {ns!r}: use a token for that namespace",
            code="wrong_namespace",
        )


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if (request.method, request.path) in PUBLIC_ROUTES or is_console_path(request.path):
        # The console signs its callers in with its own cookie and holds them to the same
        # scope check (see nymph.queue.console.guard); the API takes only the header.
        return await handler(request)
    token = _bearer(request)
    principal: Principal | None = None
    lapsed = False
    if token.startswith(SESSION_PREFIX):
        session, lapsed = await request.app[SESSIONS].authenticate(token)
        if session is not None:
            principal = session_principal(session)
    if principal is None and not lapsed:
        principal = await request.app[AUTH].authenticate(token)
    is_session = token.startswith(SESSION_PREFIX)
    del token
    if principal is None and is_session:
        raise Unauthorized(
            "this daemon session has lapsed: register again"
            if lapsed
            else "this daemon session is not known (the daemon id registered again, or the "
            "queue's database was replaced): register again",
            code="session_expired" if lapsed else "unknown_session",
        )
    if principal is None:
        log.warning("unknown token refused", method=request.method, path=request.path, peer=request.remote)
        raise Unauthorized(
            "the token is not known to this queue: check NYMPH_TOKEN (or --token) or create "
            "one with 'nymph queue token create'",
            code="invalid_token",
        )
    _check_scope(request, principal)
    request[PRINCIPAL] = principal
    return await handler(request)
