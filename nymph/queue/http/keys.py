"""Typed application and request keys shared by the app factory, middlewares and routes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from nymph.queue.models import Principal

if TYPE_CHECKING:
    from nymph.queue.auth import Authenticator
    from nymph.queue.metrics import QueueMetrics
    from nymph.queue.models import QueueSettings
    from nymph.queue.offers import OfferCache
    from nymph.queue.sessions import SessionStore
    from nymph.queue.store import Store

SETTINGS: web.AppKey[QueueSettings] = web.AppKey("nymph.settings")
STORE: web.AppKey[Store] = web.AppKey("nymph.store")
AUTH: web.AppKey[Authenticator] = web.AppKey("nymph.auth")
SESSIONS: web.AppKey[SessionStore] = web.AppKey("nymph.sessions")
METRICS: web.AppKey[QueueMetrics] = web.AppKey("nymph.metrics")
OFFERS: web.AppKey[OfferCache] = web.AppKey("nymph.offers")
#: The authenticated caller of a request.
PRINCIPAL: web.RequestKey[Principal] = web.RequestKey("nymph.principal", Principal)
