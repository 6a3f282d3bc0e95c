"""The user verbs over the queue API: ``providers``, ``modes``, ``launch``, ``launch-dockyard``,
``instances``, ``stop``, ``logs`` (argparse; the handlers are in :mod:`nymph.cli.usercatalog` and :mod:`nymph.cli.userverbs`).

The server URL and token come from ``--url`` / ``--token``, else ``NYMPH_URL`` /
``NYMPH_TOKEN``, else the ``.dreamrc`` ``server: {url, token}``; the namespace from
``--namespace`` (default ``default``).
"""

from __future__ import annotations

import argparse
from typing import Any

from nymph.cli import exitcodes, groupverbs, quota, userevents, userinstance, userresults, usersecrets
from nymph.cli.exitcodes import INTERRUPTED_EXIT, NEVER_RAN_EXIT, WAIT_TIMEOUT_EXIT
from nymph.cli.lazy import handler
from nymph.cli.output import add_output
from nymph.cli.paging import DEFAULT_LIMIT, add_paging
from nymph.netaddr import DEFAULT_URL

_VERBS = "nymph.cli.userverbs"
_CATALOG = "nymph.cli.usercatalog"
#: The instance states (``nymph.launch.state.InstanceState``; the parser does not import it).
STATES = ("queued", "starting", "running", "stopping", "stopped", "unknown")


#: The commands registered here, each of whose --help ends with the exit codes.
USER_COMMANDS = (
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
)


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    g = common.add_argument_group("queue connection")
    g.add_argument(
        "--url", help=f"queue URL (default: $NYMPH_URL, the .dreamrc server.url, or {DEFAULT_URL})"
    )
    g.add_argument("--token", help="API token (default: $NYMPH_TOKEN or the .dreamrc server.token)")
    g.add_argument(
        "--dreamrc",
        default=".dreamrc",
        help="config file with server: {url, token} (default ./.dreamrc; may be missing)",
    )
    g.add_argument("-n", "--namespace", default="default", help="control-plane namespace (default: default)")
    return common


def register(sub: Any) -> None:
    common = _common()

    providers = sub.add_parser("providers", help="add, list, show, remove and test providers")
    psub = providers.add_subparsers(dest="providers_command", metavar="COMMAND", required=True)
    p = psub.add_parser(
        "add",
        parents=[common],
        help="add a provider",
        description="Example: nymph providers add my-cluster --launcher Kube --kwarg namespace=lakeshore",
    )
    p.add_argument("name")
    p.add_argument("--launcher", required=True, help="must be exactly Kube")
    p.add_argument(
        "--kwarg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="connection kwarg: namespace, context, kubeconfig (repeatable; JSON/YAML values)",
    )
    p.add_argument(
        "--dispatch",
        choices=["direct", "daemon"],
        help="direct: the queue creates the Pods with this provider's connection (the default); "
        "daemon: a nymph daemon in the cluster does, with its own identity (then kubeconfig and "
        "context are refused)",
    )
    p.add_argument("--replace", action="store_true", help="replace an existing provider of that name")
    p.set_defaults(func=handler(_CATALOG, "cmd_providers_add"))
    p = psub.add_parser("list", parents=[common], help="list providers")
    add_paging(p, what="providers", first_page=False)
    add_output(p)
    p.set_defaults(func=handler(_CATALOG, "cmd_providers_list"))
    for verb, func, text in (
        ("show", handler(_CATALOG, "cmd_providers_show"), "show a provider"),
        ("rm", handler(_CATALOG, "cmd_providers_rm"), "remove a provider"),
    ):
        p = psub.add_parser(verb, parents=[common], help=text)
        p.add_argument("name")
        if verb == "show":
            add_output(p)
        p.set_defaults(func=func)
    _instances_parser(psub, common, metavar="name")
    p = psub.add_parser(
        "test",
        parents=[common],
        help="prove the path end to end with a dry-run probe",
        description="Queue a probe that a daemon runs as a server-side dry run, wait, print each check.",
    )
    p.add_argument("name")
    p.add_argument("--mode", help="mode whose Pod shape to probe (default: a tiny busybox Pod)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for a daemon (default 60)")
    p.set_defaults(func=handler(_CATALOG, "cmd_providers_test"))

    modes = sub.add_parser("modes", help="add, list, show and remove modes")
    msub = modes.add_subparsers(dest="modes_command", metavar="COMMAND", required=True)
    p = msub.add_parser(
        "add",
        parents=[common],
        help="add a mode",
        description="Example: nymph modes add k8s-gpu --provider my-cluster --field image=python:3.12-slim "
        "--field priority=10 --field max_runtime=30m",
    )
    p.add_argument("name")
    p.add_argument("--provider", help="the provider this mode belongs to")
    p.add_argument(
        "--field",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Pod-shape field (repeatable; JSON/YAML values): image, resources, env, node_selector, "
        "tolerations, service_account, image_pull_secrets, priority (-1000..1000), max_runtime (90s, 30m, "
        "2h, 1d), image_pull_timeout (how long a Pod may fail to pull its image before nymph stops it; "
        "default: the queue's --image-pull-timeout, 2m)",
    )
    p.add_argument("--replace", action="store_true", help="replace an existing mode of that name")
    p.set_defaults(func=handler(_CATALOG, "cmd_modes_add"))
    p = msub.add_parser("list", parents=[common], help="list modes")
    add_paging(p, what="modes", first_page=False)
    add_output(p)
    p.set_defaults(func=handler(_CATALOG, "cmd_modes_list"))
    for verb, func, text in (
        ("show", handler(_CATALOG, "cmd_modes_show"), "show a mode"),
        ("rm", handler(_CATALOG, "cmd_modes_rm"), "remove a mode"),
    ):
        p = msub.add_parser(verb, parents=[common], help=text)
        p.add_argument("name")
        if verb == "show":
            add_output(p)
        p.set_defaults(func=func)

    p = sub.add_parser(
        "launch",
        parents=[common],
        help="queue a launch (or a group of them); prints the instance (or group) id",
        description="Examples: nymph launch my-cluster --mode k8s-gpu --script train.py --tag team=ml --wait\n"
        "          nymph launch my-cluster --mode k8s-gpu --script train.py --priority 10 --max-runtime 2h\n"
        "          nymph launch my-cluster --mode cpu --script sweep.py --count 100 (a group: nymph group wait ID)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("provider")
    p.add_argument("--mode", required=True)
    p.add_argument("--script", required=True, help="Python file to run ('-' for stdin)")
    p.add_argument(
        "--tag", action="append", default=[], metavar="KEY=VALUE", help="extra Pod label (repeatable)"
    )
    p.add_argument(
        "--env", action="append", default=[], metavar="NAME=VALUE", help="extra env var (repeatable)"
    )
    p.add_argument(
        "--field",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a mode field for this launch",
    )
    p.add_argument(
        "--priority",
        type=int,
        metavar="N",
        help="run before this namespace's lower-priority launches: a whole number from -1000 to "
        "1000 (default: the mode's priority, else 0), e.g. --priority 10",
    )
    p.add_argument(
        "--max-runtime",
        metavar="DURATION",
        help="stop the job once it has run this long (it ends stopped / DeadlineExceeded): seconds "
        "or 90s, 30m, 2h, 1d, e.g. --max-runtime 2h (default: the mode's max_runtime)",
    )
    p.add_argument("--idempotency-key", help="retry-safe key (default: a fresh UUID, reused on retries)")
    p.add_argument(
        "--wait",
        action="store_true",
        help="show each state change (on stderr) and the job's output as it prints (on stdout); "
        "exit with the job's exit code (1 for a failure without one), or "
        f"{NEVER_RAN_EXIT} when the job never ran (ImagePull: its image could not be pulled for the "
        "image-pull timeout; LaunchFailed, Unschedulable, stopped before it started); on Ctrl-C "
        f"exit {INTERRUPTED_EXIT}, the launch going on (the message says how to stop it)",
    )
    p.add_argument(
        "--timeout",
        metavar="DURATION",
        help=f"with --wait: stop waiting after this long (seconds or 90s, 30m, 2h) and exit "
        f"{WAIT_TIMEOUT_EXIT}; the launch goes on (the message says how to stop it)",
    )
    p.add_argument("--quiet", action="store_true", help="with --wait: show the states only, not the output")
    groupverbs.add_group_flags(p)
    p.set_defaults(func=handler(_VERBS, "cmd_launch"))

    p = sub.add_parser(
        "launch-dockyard",
        parents=[common],
        help="queue a dockyard launch (recipe + infra) for a daemon to apply; prints the instance id",
        description="A daemon serving the provider's kube namespace renders the recipe and infra "
        "(shipped defaults, then the infra, then the overrides; no user defaults, kube context or "
        "environment of its own) and applies the objects in order. The queue renders it first and "
        "refuses an invalid one. Stop it with 'nymph stop PROVIDER ID' (the objects are deleted). "
        "Example: nymph launch-dockyard my-cluster grpo.yaml --infra grpo.infra.yaml "
        "--set infra.scheduler.queue=team-a --wait",
    )
    p.add_argument("provider")
    p.add_argument(
        "recipe", help="recipe YAML (an infra: block inside, or --infra; defaults: is not followed)"
    )
    p.add_argument("--infra", metavar="FILE", help="infra YAML (dockyard-k8s InfraConfig)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Hydra-style override, e.g. infra.sandbox.replicas=4 (keys without infra. target the "
        "recipe; ~KEY deletes; repeatable)",
    )
    p.add_argument("--idempotency-key", help="retry-safe key (default: a fresh UUID, reused on retries)")
    p.add_argument(
        "--wait",
        action="store_true",
        help="show each state change until the objects are applied; exit 1 if it failed",
    )
    p.set_defaults(func=handler(_VERBS, "cmd_launch_dockyard"))

    usersecrets.register(sub, common)
    userresults.register(sub, common)

    _instances_parser(sub, common, metavar=None)

    p = sub.add_parser(
        "stop",
        parents=[common],
        help="stop an instance",
        description="Stop an instance (its Pod or dockyard objects are deleted). Stopping one that "
        "already stopped changes nothing and says so; both exit 0.",
    )
    p.add_argument("provider")
    p.add_argument("instance_id", metavar="ID")
    p.set_defaults(func=handler(_VERBS, "cmd_stop"))

    p = sub.add_parser(
        "logs",
        parents=[common],
        help="print an instance's log (live while it runs, kept after the Pod is gone)",
        description="The log as the queue has it (at most --log-cap per instance, the oldest middle "
        "part dropped with a marker; kept --retention-days after the instance stopped). With -f, "
        "follow it as the job prints until it ends. Nothing logged yet is not an error (exit 0): "
        "stderr says why, e.g. that the Pod cannot start (ImagePull, CreateContainerError, "
        "Unschedulable: its reason and message) or that the job never ran.",
    )
    p.add_argument("provider")
    p.add_argument("instance_id", metavar="ID")
    p.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="follow the log until the job ends (and return once the instance is reported stopped, its results in, within 30s)",
    )
    p.set_defaults(func=handler(_VERBS, "cmd_logs"))

    quota.register(sub, common)
    userinstance.register(sub, common)
    groupverbs.register(sub, common)
    userevents.register(sub, common)
    for name in USER_COMMANDS:
        exitcodes.document(sub.choices[name])
        # These commands print for the user and log nothing: no structlog set-up (a tenth of a
        # second of imports) before they start.
        for each in exitcodes.each_parser(sub.choices[name]):
            each.set_defaults(logging=False)


def _instances_parser(sub: Any, common: argparse.ArgumentParser, *, metavar: str | None) -> None:
    """``nymph instances`` and ``nymph providers instances`` (the same verb, two places)."""
    p = sub.add_parser(
        "instances",
        parents=[common],
        help="list a provider's instances",
        description="The provider's instances, oldest first. The queue answers a page at a time: "
        f"without --limit or --all this shows the first {DEFAULT_LIMIT} and says on stderr when more "
        "follow. Examples: nymph instances my-cluster --state running; nymph instances my-cluster "
        "--limit 50 (then the command stderr prints, with --continue TOKEN, for the next 50); "
        "nymph instances my-cluster --all. Instances stopped longer ago than the queue's "
        "--retention-days are removed (their id then answers 'expired').",
    )
    if metavar is None:
        p.add_argument("provider", help="the provider's name")
    else:
        p.add_argument("provider", metavar=metavar)
    p.add_argument("--state", choices=STATES, help="only the instances in this state")
    add_paging(p, what="instances", first_page=True)
    add_output(p)
    p.set_defaults(func=handler(_VERBS, "cmd_instances"))
