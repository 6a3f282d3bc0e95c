"""The queue API client, used by the CLI and by the daemon.

- :mod:`nymph.client.transport`: one session, the token, one ``request``, the retry of an
  idempotent send, answers turned into results or errors;
- :mod:`nymph.client.errors`: one :class:`QueueError` subclass per kind of failure, each with
  the HTTP status and the server's ``detail`` (the token is never part of a message or a log line);
- :mod:`nymph.client.user`: :class:`UserClient`, the user routes (what the CLI holds), with
  :mod:`nymph.client.logs` (following a log) and :mod:`nymph.client.results` (downloading results);
- :mod:`nymph.client.dispatch`: :class:`DispatchClient`, the daemon's calls, each through a daemon
  session it registers (and registers again when the queue says the session lapsed).

:class:`QueueClient` (:mod:`nymph.client.queueclient`) serves both audiences: one typed async
method per route of ``nymph queue`` (see ``nymph/queue/openapi.yaml``). It and the dispatch
client are imported when first named, so a user command does not load the daemon's calls.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from nymph.client.errors import (
    QueueAuthError,
    QueueBadRequest,
    QueueConflict,
    QueueError,
    QueueNotFound,
    QueueNotInstanceDaemon,
    QueueRegistrationRefused,
    QueueUnavailable,
    safe_url,
)
from nymph.client.logs import follow_log
from nymph.client.paging import Page
from nymph.client.results import download, list_results, target
from nymph.client.transport import DEFAULT_URL, Transport
from nymph.client.user import UserClient

__all__ = [
    "DEFAULT_URL",
    "DaemonIdentity",
    "DispatchClient",
    "Page",
    "QueueAuthError",
    "QueueBadRequest",
    "QueueClient",
    "QueueConflict",
    "QueueError",
    "QueueNotFound",
    "QueueNotInstanceDaemon",
    "QueueRegistrationRefused",
    "QueueUnavailable",
    "Transport",
    "UserClient",
    "download",
    "follow_log",
    "list_results",
    "safe_url",
    "target",
]

if TYPE_CHECKING:
    from nymph.client.dispatch import DaemonIdentity, DispatchClient
    from nymph.client.queueclient import QueueClient

#: Imported when first named (``from nymph.client import QueueClient`` works as before): the
#: daemon's dispatch calls are not loaded by a user command that never makes them.
_LAZY = {
    "DaemonIdentity": "nymph.client.dispatch",
    "DispatchClient": "nymph.client.dispatch",
    "QueueClient": "nymph.client.queueclient",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
