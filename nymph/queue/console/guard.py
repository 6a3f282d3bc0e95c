"""Who may see a console page: the session cookie's token, resolved by the queue's own
:class:`~nymph.queue.auth.Authenticator` and held to the API's own scope check
(:func:`~nymph.queue.http.middlewares.check_user_scope`), so a team-a token sees team-a alone.

The middleware also makes every failure a page (never a bare 401: a caller not signed in is
sent to the sign-in page) and the answer-prepare hook puts the security headers on every
answer, redirects, errors and streams included. The token itself is never logged.
"""

from __future__ import annotations

import asyncio

import structlog
from aiohttp import web

from nymph.queue.console import security
from nymph.queue.console.keys import CSRF
from nymph.queue.console.views import error_page, see_other
from nymph.queue.errors import ServiceError
from nymph.queue.http.keys import AUTH, PRINCIPAL
from nymph.queue.http.middlewares import Handler, check_user_scope
from nymph.queue.models import Principal, Role

log = structlog.get_logger(__name__, component="queue.console")

SIGN_IN = "/console/"
#: Routes a caller reaches before signing in (by route name).
PUBLIC = frozenset({"home", "signin", "static"})
#: Routes a script of the console's own pages calls: a plain status, never a page, on failure.
FETCHED = frozenset({"log-text", "instance-json"})


async def principal_for(request: web.Request, token: str) -> Principal | None:
    """The principal of a user or admin token (daemon tokens cannot sign in)."""
    principal = await request.config_dict[AUTH].authenticate(token)
    if principal is None or principal.role is Role.DAEMON:
        return None
    return principal


async def principal_of(request: web.Request) -> tuple[str, Principal] | None:
    """The signed-in caller's token and principal, if its cookie holds a known user token."""
    token = request.cookies.get(security.SESSION_COOKIE)
    if not token:
        return None
    principal = await principal_for(request, token)
    return None if principal is None else (token, principal)


def _route_name(request: web.Request) -> str | None:
    route = request.match_info.route
    name = getattr(route, "name", None)
    return name if isinstance(name, str) else None


@web.middleware
async def console_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    name = _route_name(request)
    try:
        if request.match_info.http_exception is not None:
            raise request.match_info.http_exception
        found = await principal_of(request)
        if found is not None:
            token, principal = found
            request[PRINCIPAL] = principal
            request[CSRF] = security.csrf_token(token)
            del token
        elif name not in PUBLIC:
            if name in FETCHED:
                return web.Response(status=401, text="sign in again", content_type="text/plain")
            answer = see_other(SIGN_IN)
            if request.cookies.get(security.SESSION_COOKIE):  # a revoked or unknown token
                answer.del_cookie(security.SESSION_COOKIE, path=security.COOKIE_PATH)
            return answer
        if found is not None:
            check_user_scope(found[1], request.match_info.get("ns"))
        return await handler(request)
    except ServiceError as exc:
        if name in FETCHED:
            return web.Response(status=exc.status, text=exc.detail, content_type="text/plain")
        return error_page(request, status=exc.status, title=exc.code, detail=exc.detail)
    except web.HTTPException as exc:
        if exc.status < 400:
            return web.Response(status=exc.status, headers=exc.headers)
        return error_page(request, status=exc.status, title=exc.reason, detail=exc.text or exc.reason)
    except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
        raise
    except Exception:
        log.exception("console page failed", method=request.method, path=request.path)
        return error_page(
            request, status=500, title="internal", detail="the queue hit an unexpected error: see its log"
        )


async def add_security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """On every answer the console's app prepares (its pages, redirects, errors, streams)."""
    for key, value in security.SECURITY_HEADERS.items():
        if key == "Cache-Control" and key in response.headers:
            continue
        response.headers[key] = value
