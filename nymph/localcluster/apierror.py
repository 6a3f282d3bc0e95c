"""The error of the local control plane's admin requests (:meth:`LocalCluster.api`)."""

from __future__ import annotations

from nymph.errors import NymphError


class ApiAnswerError(NymphError):
    """The API server answered an admin request with HTTP ``status`` (404: no such object)."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status
