"""``nymph`` subcommands of this area (moving here from ``nymph.launch.cli``)."""

from nymph.launch.cli import register

__all__ = ["register"]
