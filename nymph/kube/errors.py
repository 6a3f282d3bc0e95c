"""Errors at the Kubernetes edge, classified from kubectl output or API status codes."""

from __future__ import annotations

import re

from nymph.errors import NymphError


class KubeError(NymphError):
    """A Kubernetes call failed. ``transient`` errors are worth retrying with backoff."""

    transient = False

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class NotFound(KubeError):
    pass


class AlreadyExists(KubeError):
    pass


class Conflict(KubeError):
    transient = True


class FieldConflict(Conflict):
    """A server-side apply refused because another field manager owns fields it sets (the
    object exists and was written by someone else): sending it again never helps."""

    transient = False


#: How the API server words a server-side apply's field-manager conflict.
_FIELD_CONFLICT = re.compile(r"apply failed with \d+ conflicts?", re.I)


class Forbidden(KubeError):
    pass


class Unauthorized(KubeError):
    pass


class Invalid(KubeError):
    pass


class Throttled(KubeError):
    transient = True


class Unavailable(KubeError):
    """The API server could not be reached, timed out or returned 5xx."""

    transient = True


_STATUS_CLASSES: dict[int, type[KubeError]] = {
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Conflict,
    422: Invalid,
    400: Invalid,
    429: Throttled,
}


def from_status(status: int, message: str) -> KubeError:
    if status >= 500:
        return Unavailable(message, status=status)
    cls = _STATUS_CLASSES.get(status, KubeError)
    if status == 409 and "already exists" in message.lower():
        cls = AlreadyExists
    elif status == 409 and _FIELD_CONFLICT.search(message):
        cls = FieldConflict
    return cls(message, status=status)


_PATTERNS: tuple[tuple[re.Pattern[str], type[KubeError]], ...] = (
    # First: an API server that cannot be reached is transient whatever else the text says
    # (kubectl's client-side validation reports it as "error validating ... failed to download
    # openapi ... connection refused", which must not read as Invalid).
    (
        re.compile(
            r"failed to download openapi|connection refused|connection reset by peer|"
            r"unable to connect to the server|TLS handshake timeout",
            re.I,
        ),
        Unavailable,
    ),
    (re.compile(r"\(AlreadyExists\)|already exists", re.I), AlreadyExists),
    (re.compile(r"\(Forbidden\)|is forbidden", re.I), Forbidden),
    (re.compile(r"\(Unauthorized\)|must be logged in|provide credentials", re.I), Unauthorized),
    (re.compile(r"\(NotFound\)|not found", re.I), NotFound),
    (re.compile(r"\(Invalid\)|is invalid|unknown field|error validating|BadRequest", re.I), Invalid),
    (_FIELD_CONFLICT, FieldConflict),
    (re.compile(r"\(Conflict\)|conflict", re.I), Conflict),
    (re.compile(r"\(TooManyRequests\)|too many requests|rate limit", re.I), Throttled),
    (
        re.compile(
            r"connection refused|was refused|connection reset|unable to connect|i/o timeout|context deadline exceeded|"
            r"Client\.Timeout|no such host|EOF|ServiceUnavailable|InternalError|"
            r"the server is currently unable|TLS handshake timeout",
            re.I,
        ),
        Unavailable,
    ),
)


def classify_kubectl(stderr: str) -> KubeError:
    """Map kubectl's error text to an error class. The text itself is kept as the message."""
    text = stderr.strip() or "kubectl failed without output"
    for pattern, cls in _PATTERNS:
        if pattern.search(text):
            return cls(text)
    return KubeError(text)
