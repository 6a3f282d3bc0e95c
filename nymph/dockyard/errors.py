"""Errors of the dockyard area: each names the file, the key path and what is allowed."""

from __future__ import annotations

from nymph.errors import ConfigError, NymphError


class DockyardConfigError(ConfigError):
    """A recipe, infra file, default file or override is malformed.

    ``source`` is the file (or ``override 'k=v'``) the offending value came from, ``path``
    the dotted key path (``infra.sandbox.port``), ``message`` what is wrong and what is
    allowed. Rendered as one line: ``SOURCE: PATH: MESSAGE``.
    """

    def __init__(self, message: str, *, path: str | None = None, source: str | None = None):
        self.message = message
        self.path = path
        self.source = source
        parts = [p for p in (source, path) if p]
        super().__init__(": ".join([*parts, message]))


class DockyardBudgetError(DockyardConfigError):
    """Resolving the interpolations of user input ran out of its budget (steps or size)."""


class DockyardLiveError(NymphError):
    """A live dockyard command failed: one line saying what failed and what to do next."""
