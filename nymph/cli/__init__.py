"""The ``nymph`` command.

All argparse lives in this package, one module per area (``nymph.cli.<area>``); library code
never parses arguments. Each area registers its own subcommands (``register(sub)``); a handler
takes the parsed ``argparse.Namespace`` and returns an exit code. A :class:`NymphError` becomes
one clear line on stderr and exit code 2; nothing else is caught here.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from nymph import __version__
from nymph.errors import NymphError

#: Modules that contribute subcommands, in ``--help`` order. Missing ones are skipped so a
#: partial install still runs.
_AREAS = (
    "nymph.cli.render",
    "nymph.cli.queue",
    "nymph.cli.daemon",
    "nymph.cli.dev",
    "nymph.cli.dockyard",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nymph",
        description=(
            "nymph dispatches jobs into Kubernetes from inside the cluster: a queue of launches, "
            "a daemon per node that applies them with kubectl, and an audit log of every launch."
        ),
        epilog="Run 'nymph COMMAND --help' for the options of one command.",
    )
    parser.add_argument("--version", action="version", version=f"nymph {__version__}")
    parser.add_argument(
        "--log-format",
        choices=("auto", "json", "console"),
        default="auto",
        help="log format (default: console on a terminal, JSON otherwise)",
    )
    parser.add_argument("--log-level", default="info", help="debug, info, warning or error")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _AREAS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from nymph.logsetup import configure_logging  # structlog: once a command runs, not for --help

    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    configure_logging(fmt=args.log_format, level=args.log_level)
    # A command loads the generated Kubernetes client one class at a time (see nymph.kube.slim):
    # a daemon or queue process then holds the few dozen classes it uses, not about 850. It is
    # installed once the command is known and before its handler imports anything (building
    # the parser imports no Kubernetes client). Library users importing nymph's modules get
    # the package as its authors ship it.
    from nymph.kube import slim

    slim.install()
    try:
        code: int = args.func(args)
    except NymphError as exc:
        print(f"nymph: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("nymph: interrupted", file=sys.stderr)
        return 130
    return code
