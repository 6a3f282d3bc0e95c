"""Typed keys of the console's sub-application and of its requests."""

from __future__ import annotations

import jinja2
from aiohttp import web

#: The template environment (autoescaping on for every template).
TEMPLATES: web.AppKey[jinja2.Environment] = web.AppKey("nymph.console.templates")
#: The CSRF token a signed-in request's forms carry (absent before sign-in).
CSRF: web.RequestKey[str] = web.RequestKey("nymph.console.csrf", str)
