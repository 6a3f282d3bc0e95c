"""``nymph instance show PROVIDER ID`` (and its short form ``nymph show PROVIDER ID``): one
instance, whole: its state and why, where it runs, how it ended, why it waits, its history.
The parser is built without the client; the handler imports it when it runs."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from nymph.cli.output import add_output

if TYPE_CHECKING:
    from nymph.client import UserClient

_DESCRIPTION = (
    "An instance's state, reason, message and node; once its container ended, the exit code and "
    "the termination reason and message; while queued, why it waits; why some results were not "
    "kept; then its history, one state change a line (as launch --wait prints them). With -o "
    "json or -o yaml, the queue's instance object. A missing instance is an error (exit 2). "
    "Example: nymph instance show my-cluster lakeshore-1a2b3c4d -o json"
)


def cmd_instance_show(args: argparse.Namespace) -> int:
    from nymph.cli.output import emit
    from nymph.cli.userverbs import _run
    from nymph.cli.userview import print_instance

    async def body(client: UserClient) -> int:
        inst = await client.get_instance(provider=args.provider, instance_id=args.instance_id)
        if not emit(args, inst):
            print_instance(inst)
        return 0

    return _run(args, body)


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    instance = sub.add_parser(
        "instance", help="show one instance (its state, how it ended, its history)", description=_DESCRIPTION
    )
    isub = instance.add_subparsers(dest="instance_command", metavar="COMMAND", required=True)
    for parent, name, text in (
        (isub, "show", "show an instance: state, reason, node, exit code, waiting, history"),
        (sub, "show", "the same as 'nymph instance show PROVIDER ID'"),
    ):
        p = parent.add_parser(name, parents=[common], help=text, description=_DESCRIPTION)
        p.add_argument("provider", help="the provider's name")
        p.add_argument("instance_id", metavar="ID", help="the instance id (lakeshore-...)")
        add_output(p)
        p.set_defaults(func=cmd_instance_show)
