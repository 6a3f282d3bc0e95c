"""``nymph`` subcommands of this area (moving here from ``nymph.daemon.cli``)."""

from nymph.daemon.cli import register

__all__ = ["register"]
