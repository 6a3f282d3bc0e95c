"""The queue API client, used by the CLI and by the daemon (see :mod:`nymph.client.user`)."""

from nymph.client.user import (
    DEFAULT_URL,
    DaemonIdentity,
    QueueAuthError,
    QueueBadRequest,
    QueueClient,
    QueueConflict,
    QueueError,
    QueueNotFound,
    QueueNotInstanceDaemon,
    QueueRegistrationRefused,
    QueueUnavailable,
    safe_url,
)

__all__ = [
    "DEFAULT_URL",
    "DaemonIdentity",
    "QueueAuthError",
    "QueueBadRequest",
    "QueueClient",
    "QueueConflict",
    "QueueError",
    "QueueNotFound",
    "QueueNotInstanceDaemon",
    "QueueRegistrationRefused",
    "QueueUnavailable",
    "safe_url",
]
