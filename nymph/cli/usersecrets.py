"""``nymph secrets set|list|rm``: the queue's secret store, per control-plane namespace.

A value is read from a file or an environment variable (never from the command line, where it
would end up in shell history and the process list) and is never printed back.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING, Any

from nymph.cli.output import add_output
from nymph.cli.paging import add_paging, fetch
from nymph.errors import ConfigError

if TYPE_CHECKING:
    from nymph.client import UserClient


def _value(args: argparse.Namespace) -> str:
    if args.from_env:
        value = os.environ.get(args.from_env)
        if value is None:
            raise ConfigError(f"--from-env {args.from_env}: that environment variable is not set")
        return value
    try:
        with open(os.path.expanduser(args.from_file), encoding="utf-8") as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"--from-file {args.from_file}: cannot read it ({exc.__class__.__name__})"
        ) from None


def cmd_secrets_set(args: argparse.Namespace) -> int:
    from nymph.cli.userverbs import _run

    value = _value(args)

    async def body(client: UserClient) -> int:
        await client.set_secret(name=args.name, value=value)
        print(
            f"secret {args.name} stored in namespace {client.namespace}; use it as "
            f'kubeconfig: {{"$secret": "{args.name}"}}'
        )
        return 0

    return _run(args, body)


def cmd_secrets_list(args: argparse.Namespace) -> int:
    from nymph.cli.output import emit
    from nymph.cli.userverbs import _run
    from nymph.cli.userview import table

    async def body(client: UserClient) -> int:
        items = await fetch(
            args,
            lambda limit, token: client.secrets_page(limit=limit, continue_=token),
            what="secrets",
            first_page=False,
            command=["secrets", "list"],
        )
        if emit(args, items):
            return 0
        if not items:
            print(f"no secrets in namespace {client.namespace}")
            return 0
        print(
            table(
                ("NAME", "CREATED", "UPDATED"), [(i["name"], i["createdAt"], i["updatedAt"]) for i in items]
            )
        )
        return 0

    return _run(args, body)


def cmd_secrets_rm(args: argparse.Namespace) -> int:
    from nymph.cli.userverbs import _run

    async def body(client: UserClient) -> int:
        await client.delete_secret(name=args.name)
        print(f"secret {args.name} removed from namespace {client.namespace}")
        return 0

    return _run(args, body)


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    secrets = sub.add_parser("secrets", help="set, list and remove the queue's secrets (e.g. kubeconfigs)")
    ssub = secrets.add_subparsers(dest="secrets_command", metavar="COMMAND", required=True)
    p = ssub.add_parser(
        "set",
        parents=[common],
        help="store a secret (encrypted by the queue)",
        description="Example: nymph secrets set prod-kube --from-file ~/.kube/prod.yaml, then "
        'nymph providers add prod --launcher Kube --kwarg kubeconfig=\'{"$secret": "prod-kube"}\'',
    )
    p.add_argument("name")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--from-file", metavar="FILE", help="read the value from FILE")
    src.add_argument("--from-env", metavar="VAR", help="read the value from environment variable VAR")
    p.set_defaults(func=cmd_secrets_set)
    p = ssub.add_parser("list", parents=[common], help="list secrets (names and dates only)")
    add_paging(p, what="secrets", first_page=False)
    add_output(p)
    p.set_defaults(func=cmd_secrets_list)
    p = ssub.add_parser("rm", parents=[common], help="remove a secret")
    p.add_argument("name")
    p.set_defaults(func=cmd_secrets_rm)
