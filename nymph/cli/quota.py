"""``nymph quota set NS`` and ``nymph quota show [NS]``: a namespace's share of the cluster
(argparse only; the handlers are in :mod:`nymph.cli.quotaverbs`)."""

from __future__ import annotations

import argparse
from typing import Any

from nymph.cli.lazy import handler
from nymph.cli.output import add_output

_VERBS = "nymph.cli.quotaverbs"

_SET_HELP = """\
Set how the queue shares the cluster with a namespace (a team). Every setting is optional and
a setting left out stays as it is; 'none' removes a limit. Takes an admin token (nymph queue
token create --role admin). A change applies from the next claim; lowering a limit never stops
running launches.

  --weight W          the namespace's share, relative to the others' (default 1)
  --max-running N     at most N launches running at once (leased or with a Pod)
  --cpu/--memory/--gpu Q   at most Q requested by its running launches together
  --max-runtime D     the longest run a launch may ask for (90s, 30m, 2h, 1d)
  --default-runtime D the run a launch gets when it names no max_runtime

Example: nymph quota set team-a --weight 2 --max-running 50 --gpu 8 --max-runtime 1d
"""


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    quota = sub.add_parser("quota", help="show and set namespaces' shares, quotas and runtime limits")
    qsub = quota.add_subparsers(dest="quota_command", metavar="COMMAND", required=True)
    p = qsub.add_parser(
        "set",
        parents=[common],
        help="set a namespace's weight, quotas and runtime limits (admin token)",
        description=_SET_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("target", metavar="NS", help="the namespace (team) to set")
    p.add_argument("--weight", metavar="W", help="its share relative to other namespaces (default 1)")
    p.add_argument("--max-running", metavar="N", help="at most N launches running at once ('none': no cap)")
    for flag, resource in (("--cpu", "cpu"), ("--memory", "memory"), ("--gpu", "nvidia.com/gpu")):
        p.add_argument(
            flag, metavar="Q", help=f"cap on the {resource} its running launches request ('none': no cap)"
        )
    p.add_argument("--max-runtime", metavar="D", help="longest run a launch may ask for: 90s, 30m, 2h, 1d")
    p.add_argument("--default-runtime", metavar="D", help="run a launch gets when it names none")
    p.set_defaults(func=handler(_VERBS, "cmd_quota_set"))
    p = qsub.add_parser(
        "show",
        parents=[common],
        help="show a namespace's settings and usage (every namespace's with an admin token)",
        description="Without NS, every namespace that has settings or running launches (admin "
        "token); with NS, that namespace's (its own users may read it). Example: nymph quota show team-a",
    )
    p.add_argument("target", metavar="NS", nargs="?", help="the namespace (default: every one)")
    add_output(p)
    p.set_defaults(func=handler(_VERBS, "cmd_quota_show"))
