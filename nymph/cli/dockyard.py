"""``nymph`` subcommands of this area (moving here from ``nymph.dockyard.cli``)."""

from nymph.dockyard.cli import register

__all__ = ["register"]
