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

#: Which area registers each top-level command: ``nymph COMMAND ...`` builds that area's
#: parsers only, so a user command does not import the others' (dockyard's render, the dev
#: cluster's); ``nymph --help`` and an unknown command build them all. tests/cli/test_startup.py
#: checks this table against what the areas register.
COMMAND_AREAS = {
    "render": "nymph.cli.render",
    **dict.fromkeys(
        (
            "queue",
            "providers",
            "modes",
            "launch",
            "launch-dockyard",
            "secrets",
            "results",
            "instances",
            "instance",
            "show",
            "stop",
            "logs",
            "events",
            "quota",
            "group",
        ),
        "nymph.cli.queue",
    ),
    "daemon": "nymph.cli.daemon",
    "audit": "nymph.cli.daemon",
    "dev": "nymph.cli.dev",
    "dockyard": "nymph.cli.dockyard",
}
#: The top-level options that take a value (``--log-level debug``), to find the command.
_VALUED = ("--log-format", "--log-level")


def command_of(argv: Sequence[str]) -> str | None:
    """The top-level command ``argv`` names (its first word that is not an option), or None."""
    words = iter(argv)
    for word in words:
        if word == "--":
            return next(words, None)
        if word in _VALUED:
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``nymph`` parser; given ``argv``, only the area of the command it names (all of them
    for none, or one no area registers)."""
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
    area = COMMAND_AREAS.get(command_of(argv) or "") if argv is not None else None
    for name in (area,) if area else _AREAS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    if getattr(args, "logging", True):  # the user verbs log nothing: they skip structlog
        from nymph.logsetup import configure_logging  # once a command runs, not for --help

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
