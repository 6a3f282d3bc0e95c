"""``nymph`` subcommands of this area (moving here from ``nymph.dev``)."""

from nymph.dev import register

__all__ = ["register"]
