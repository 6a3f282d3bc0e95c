"""``nymph`` subcommands of this area (moving here from ``nymph.queue.cli``)."""

from nymph.queue.cli import register

__all__ = ["register"]
