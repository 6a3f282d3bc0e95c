"""The errors of :class:`nymph.client.QueueClient`, one class per kind of failure, and the URL
form used in their messages (never with credentials)."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from nymph.errors import NymphError


class QueueError(NymphError):
    """A queue call failed. ``status`` is the HTTP status (None when no answer came)."""

    def __init__(
        self, message: str, *, status: int | None = None, code: str | None = None, detail: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.detail = detail


class QueueUnavailable(QueueError):
    """No answer: connection refused or reset, a timeout, or a 5xx."""


class QueueAuthError(QueueError):
    """401 (missing or unknown token) or 403 (wrong role or namespace)."""


class QueueNotInstanceDaemon(QueueAuthError):
    """403 ``not_instance_daemon``: a report, log or result for an instance this daemon does not
    run (another daemon applied it, or holds its task). Nothing was stored, and the same item is
    refused every time it is sent again: drop it."""


class QueueNotFound(QueueError):
    """404."""


class QueueConflict(QueueError):
    """409: already exists, a reused idempotency key, or a lost lease."""


class QueueRegistrationRefused(QueueConflict):
    """409 on registration: the daemon id has a live session on another node. Nothing the
    daemon wanted to send is wrong: keep it and retry once the id is free (or fix the id)."""


class QueueBadRequest(QueueError):
    """400, 413 or 422: the request was refused as invalid."""


BY_STATUS: dict[int, type[QueueError]] = {
    400: QueueBadRequest,
    401: QueueAuthError,
    403: QueueAuthError,
    404: QueueNotFound,
    409: QueueConflict,
    413: QueueBadRequest,
    422: QueueBadRequest,
}

#: Answers told apart by their code (checked before :data:`BY_STATUS`).
BY_CODE: dict[str, type[QueueError]] = {
    "not_instance_daemon": QueueNotInstanceDaemon,
}


def safe_url(url: str) -> str:
    """``url`` without any user:password part, for messages."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    netloc = parts.hostname or ""
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
