"""The project's own error hierarchy.

Every error that reaches a user is a :class:`NymphError`. Its message is one line that says
what is wrong and what to do about it, and never carries secret material.
"""

from __future__ import annotations


class NymphError(Exception):
    """Base of every error nymph raises on purpose."""


class ConfigError(NymphError):
    """A provider, mode or ``.dreamrc`` is malformed."""


class ValidationError(NymphError):
    """A launch (or one of its fields) is invalid.

    ``field`` names the offending field in dotted form (``mode.image``, ``tags.team``).
    """

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


class CredentialsError(NymphError):
    """A kubeconfig could not be resolved or staged. Never contains the secret itself."""
