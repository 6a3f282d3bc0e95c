"""Handlers imported when their command runs, not when the parser is built.

``nymph --help`` and every command's parser stay light: the module behind a handler (the queue
server, the daemon, the Kubernetes client, the dockyard package) is imported only by the command
that calls it.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable

Handler = Callable[[argparse.Namespace], int]


def handler(module: str, name: str) -> Handler:
    """A handler that imports ``module`` and calls its ``name`` with the parsed arguments."""

    def run(args: argparse.Namespace) -> int:
        func: Handler = getattr(importlib.import_module(module), name)
        return func(args)

    run.__name__ = run.__qualname__ = name
    run.__doc__ = f"{module}.{name}, imported when the command runs"
    return run
