"""Rendering the console's pages: one Jinja2 environment with autoescaping on for every
template (so any text a launch carries, its tags, script or log, is shown as text), and the
context every page shares (who is signed in, the CSRF token of its forms)."""

from __future__ import annotations

from typing import Any

import jinja2
from aiohttp import web

from nymph.queue.console import security
from nymph.queue.console.keys import CSRF, TEMPLATES
from nymph.queue.http.keys import PRINCIPAL


def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("nymph.queue.console", "templates"),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def page(request: web.Request, template: str, *, status: int = 200, **context: Any) -> web.Response:
    """``template`` rendered with ``context`` and what every page shows."""
    principal = request.get(PRINCIPAL)
    html = (
        request.config_dict[TEMPLATES]
        .get_template(template)
        .render(
            principal=principal,
            csrf=request.get(CSRF, ""),
            csrf_field=security.CSRF_FIELD,
            **context,
        )
    )
    return web.Response(text=html, status=status, content_type="text/html", charset="utf-8")


def error_page(request: web.Request, *, status: int, title: str, detail: str) -> web.Response:
    return page(request, "error.html", status=status, title=title, detail=detail)


def see_other(location: str) -> web.Response:
    """A redirect after a form (303), built as an answer so the security headers join it."""
    return web.Response(status=303, headers={"Location": location})


def set_cookie(response: web.StreamResponse, name: str, value: str, *, secure: bool) -> None:
    """A console cookie: ``HttpOnly``, ``SameSite=Strict``, ``Secure`` over TLS, no ``Max-Age``
    (it ends with the browser session)."""
    response.set_cookie(
        name, value, path=security.COOKIE_PATH, httponly=True, samesite="Strict", secure=secure
    )


def over_tls(request: web.Request) -> bool:
    """The browser reached the console over TLS: directly, or through a proxy that terminated it
    and says so (trusting that header can only add ``Secure``, never take it away)."""
    forwarded = request.headers.get("X-Forwarded-Proto", "").split(",")[0].strip().lower()
    return request.secure or forwarded == "https"
