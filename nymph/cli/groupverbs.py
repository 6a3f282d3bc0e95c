"""``nymph group show|wait|stop ID``: a launch group (``nymph launch PROVIDER --count N`` or
``--items FILE`` makes one). The parsers are built without the client; the handlers are in
:mod:`nymph.cli.usergroups`, imported when they run."""

from __future__ import annotations

import argparse
from typing import Any

from nymph.cli.exitcodes import WAIT_TIMEOUT_EXIT
from nymph.cli.lazy import handler
from nymph.cli.output import add_output

_HANDLERS = "nymph.cli.usergroups"
_DESCRIPTION = (
    "A launch group: its members (each launch's latest attempt) counted by state and by reason. "
    "'wait' waits until every member has stopped: exit 0 when all completed, 1 when any failed "
    "or was stopped (printing the counts), 2 on an error. 'stop' stops every member, queued or "
    "running (again: nothing more to do, exit 0). Example: nymph group wait group-1a2b3c4d5e6f"
)


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    group = sub.add_parser("group", help="show, wait for or stop a launch group", description=_DESCRIPTION)
    gsub = group.add_subparsers(dest="group_command", metavar="COMMAND", required=True)
    for name, func, text in (
        ("show", "cmd_group_show", "a group's counts by state and reason"),
        ("wait", "cmd_group_wait", "wait until every member stopped; exit 0 all completed, 1 any did not"),
        ("stop", "cmd_group_stop", "stop every member, queued or running"),
    ):
        p = gsub.add_parser(name, parents=[common], help=text, description=_DESCRIPTION)
        p.add_argument("group_id", metavar="ID", help="the group id (group-...)")
        if name == "show":
            add_output(p)
            p.add_argument("--instances", action="store_true", help="also list every member")
        if name == "wait":
            p.add_argument(
                "--timeout",
                metavar="DURATION",
                help=f"stop waiting after this long (seconds or 90s, 30m, 2h) and exit {WAIT_TIMEOUT_EXIT}",
            )
        p.set_defaults(func=handler(_HANDLERS, func))


def add_group_flags(p: argparse.ArgumentParser) -> None:
    """``nymph launch``'s flags that make it a launch group."""
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--count",
        type=int,
        metavar="N",
        help="launch N copies as one group (1 to 10000; each gets NYMPH_GROUP_INDEX 0..N-1); prints "
        "the group id",
    )
    g.add_argument(
        "--items",
        metavar="FILE",
        help="launch one copy per line of FILE as one group: JSON lines of per-launch env, tags and "
        'fields, e.g. {"env": {"LR": "0.1"}}, merged over --env/--tag/--field; prints the group id',
    )
