"""Errors the queue service answers with.

Each carries the HTTP status, a short machine-readable ``code`` and a ``detail`` sentence that
says what to do. The error middleware turns them into ``{"error": code, "detail": detail}``.
Details never contain a token or other secret material.
"""

from __future__ import annotations

from nymph.errors import NymphError


class ServiceError(NymphError):
    """Base of every error the queue service answers with on purpose."""

    status = 500
    default_code = "internal"

    def __init__(self, detail: str, *, code: str | None = None) -> None:
        self.code = code or self.default_code
        self.detail = detail
        super().__init__(detail)


class BadRequest(ServiceError):
    """The request is well-formed but its content is not acceptable (400)."""

    status = 400
    default_code = "bad_request"


class Unauthorized(ServiceError):
    """No token, or a token the service does not know (401)."""

    status = 401
    default_code = "unauthorized"


class Forbidden(ServiceError):
    """The token is valid but its role or namespace scope does not allow this (403)."""

    status = 403
    default_code = "forbidden"


class NotInstanceDaemon(Forbidden):
    """A daemon session sent a report, log or result for an instance that is not its own: it
    holds no lease of the instance's tasks and is not the daemon that applied it (403).

    ``instance_id`` and ``action`` say what was refused (for the queue's log; no secrets)."""

    default_code = "not_instance_daemon"

    def __init__(self, detail: str, *, instance_id: str, action: str) -> None:
        super().__init__(detail)
        self.instance_id = instance_id
        self.action = action


class NotFound(ServiceError):
    status = 404
    default_code = "not_found"


class Conflict(ServiceError):
    status = 409
    default_code = "conflict"


class Gone(ServiceError):
    """What was asked for existed once and was removed (410): an event cursor older than the kept events."""

    status = 410
    default_code = "gone"


class PayloadTooLarge(ServiceError):
    status = 413
    default_code = "too_large"


class UnsupportedMediaType(ServiceError):
    """The body uses a content coding the queue does not decode (415)."""

    status = 415
    default_code = "unsupported_encoding"


class Unprocessable(ServiceError):
    """The body is JSON but has the wrong shape: a missing key or a value of the wrong type (422)."""

    status = 422
    default_code = "invalid_body"


class Unavailable(ServiceError):
    """The database cannot be reached right now (503). Its detail says whether nothing was
    changed (retry), or a change was sent and its outcome is not known."""

    status = 503
    default_code = "database_unavailable"
