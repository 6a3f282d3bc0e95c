""":class:`QueueClient`: both audiences of the queue API in one client (imported from
:mod:`nymph.client` when first named, so the CLI's user verbs do not load the dispatch calls)."""

from __future__ import annotations

from nymph.client.dispatch import DispatchClient
from nymph.client.user import UserClient


class QueueClient(UserClient, DispatchClient):
    """Async client of the whole queue API, the user routes and the dispatch routes. Use as
    ``async with QueueClient(...) as client:``."""
