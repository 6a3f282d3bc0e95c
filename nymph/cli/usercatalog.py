"""The handlers of ``providers`` and ``modes`` over the queue API (their parsers are in
:mod:`nymph.cli.user`; the connection and error handling are :mod:`nymph.cli.userverbs`')."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

import yaml

from nymph.cli.output import emit
from nymph.cli.paging import fetch
from nymph.cli.userverbs import ProbeTimeout, _run
from nymph.cli.userview import print_checks, table
from nymph.client import UserClient
from nymph.launch.dreamrc import mode_from_cli, provider_from_cli

_DISPATCH_SAYS = {
    "direct": "the queue creates its Pods with the provider's connection",
    "daemon": "a nymph daemon in the cluster creates its Pods with its own identity",
}


def describe_kubeconfig(ref: object) -> str:
    """How ``providers show`` names a kubeconfig ref (never content)."""
    if isinstance(ref, dict) and "$secret" in ref:
        return f"<secret {ref['$secret']}>"
    if isinstance(ref, str):
        return f"<path {ref}>"
    return "<none: the queue's own credentials, if its operator allows them>"


def cmd_providers_add(args: argparse.Namespace) -> int:
    provider = provider_from_cli(args.name, launcher=args.launcher, kwargs=args.kwarg)

    async def body(client: UserClient) -> int:
        saved = await client.create_provider(
            name=provider.name,
            kwargs=provider.kwargs,
            launcher=provider.launcher,
            dispatch=args.dispatch or None,
            replace=args.replace,
        )
        dispatch = saved.get("dispatch", "")
        print(f"provider {provider.name} saved in namespace {client.namespace}")
        print(f"dispatch: {dispatch} ({_DISPATCH_SAYS.get(dispatch, '')})")
        ref = (saved.get("kwargs") or {}).get("kubeconfig")
        if ref is not None:
            print(f"kubeconfig: {describe_kubeconfig(ref)}")
        elif dispatch == "direct":
            print(
                f"warning: provider {provider.name} uses dispatch: direct without a kubeconfig: its "
                "launches work only if the queue lends its own credentials (queue serve "
                "--ambient-kubeconfig); otherwise add one with '--kwarg kubeconfig=PATH' or "
                "'--kwarg kubeconfig={\"$secret\": NAME}' (nymph secrets set NAME --from-file FILE), "
                "or use '--dispatch daemon' to have the nymph daemon in the cluster create its Pods",
                file=sys.stderr,
            )
        return 0

    return _run(args, body)


def cmd_providers_list(args: argparse.Namespace) -> int:
    async def body(client: UserClient) -> int:
        items = await fetch(
            args,
            lambda limit, token: client.providers_page(limit=limit, continue_=token),
            what="providers",
            first_page=False,
            command=["providers", "list"],
        )
        if emit(args, items):
            return 0
        if not items:
            print(f"no providers in namespace {client.namespace}")
            return 0
        rows = [
            (
                p["name"],
                p["launcher"],
                p["dispatch"],
                p["kwargs"].get("namespace", "default"),
                p["kwargs"].get("context", ""),
            )
            for p in items
        ]
        print(table(("NAME", "LAUNCHER", "DISPATCH", "KUBE NAMESPACE", "CONTEXT"), rows))
        return 0

    return _run(args, body)


def masked(provider: dict[str, Any]) -> dict[str, Any]:
    """A provider as ``providers show`` prints it, in every format: its kubeconfig named by
    :func:`describe_kubeconfig`, never its content (pure)."""
    kwargs = dict(provider.get("kwargs") or {})
    if provider.get("dispatch") == "direct" or "kubeconfig" in kwargs:
        kwargs["kubeconfig"] = describe_kubeconfig(kwargs.get("kubeconfig"))
    return {**provider, "kwargs": kwargs}


def cmd_providers_show(args: argparse.Namespace) -> int:
    async def body(client: UserClient) -> int:
        provider = await client.get_provider(name=args.name)
        if emit(args, masked(provider)):
            return 0
        print(yaml.safe_dump(masked(provider), sort_keys=False), end="")
        dispatch = str(provider.get("dispatch", ""))
        print(f"# dispatch {dispatch}: {_DISPATCH_SAYS.get(dispatch, '')}")
        return 0

    return _run(args, body)


def cmd_providers_rm(args: argparse.Namespace) -> int:
    async def body(client: UserClient) -> int:
        await client.delete_provider(name=args.name)
        print(f"provider {args.name} removed")
        return 0

    return _run(args, body)


def cmd_providers_test(args: argparse.Namespace) -> int:
    async def body(client: UserClient) -> int:
        task_id = await client.test_provider(provider=args.name, mode=args.mode)
        print(f"probe {task_id} queued for provider {args.name}; waiting up to {args.timeout:g}s")
        deadline = time.monotonic() + args.timeout
        while True:
            task = await client.get_task(task_id=task_id)
            if task["status"] in ("done", "failed", "cancelled"):
                break
            if time.monotonic() >= deadline:
                if task["status"] == "pending":
                    raise ProbeTimeout(
                        f"no daemon picked up probe {task_id} within {args.timeout:g}s: is a nymph "
                        f"daemon running and serving the provider's kube namespace? "
                        f"(see 'GET /v1/namespaces/{client.namespace}/daemons')"
                    )
                raise ProbeTimeout(
                    f"a daemon claimed probe {task_id} but did not finish it within {args.timeout:g}s"
                )
            await asyncio.sleep(0.25)
        ok = print_checks(task["result"]) and task["status"] == "done"
        if task["error"]:
            print(f"  error: {task['error']}")
        print(f"provider {args.name}: {'ok' if ok else 'FAILED'}")
        return 0 if ok else 1

    return _run(args, body)


# --- modes ---------------------------------------------------------------------------------


def cmd_modes_add(args: argparse.Namespace) -> int:
    mode = mode_from_cli(args.name, provider=args.provider, fields=args.field)

    async def body(client: UserClient) -> int:
        await client.create_mode(
            name=mode.name, provider=mode.provider, fields=mode.fields, replace=args.replace
        )
        print(f"mode {mode.name} saved in namespace {client.namespace}")
        if mode.fields.get("image") in (None, ""):
            print(
                f"warning: mode {mode.name} has no image: its launches fail until it has one "
                f"(nymph modes add {mode.name} --replace --field image=IMAGE ...)",
                file=sys.stderr,
            )
        return 0

    return _run(args, body)


def cmd_modes_list(args: argparse.Namespace) -> int:
    async def body(client: UserClient) -> int:
        items = await fetch(
            args,
            lambda limit, token: client.modes_page(limit=limit, continue_=token),
            what="modes",
            first_page=False,
            command=["modes", "list"],
        )
        if emit(args, items):
            return 0
        if not items:
            print(f"no modes in namespace {client.namespace}")
            return 0
        rows = [(m["name"], m["provider"] or "", m["fields"].get("image", "")) for m in items]
        print(table(("NAME", "PROVIDER", "IMAGE"), rows))
        return 0

    return _run(args, body)


def cmd_modes_show(args: argparse.Namespace) -> int:
    async def body(client: UserClient) -> int:
        mode = await client.get_mode(name=args.name)
        if not emit(args, mode):
            print(yaml.safe_dump(mode, sort_keys=False), end="")
        return 0

    return _run(args, body)


def cmd_modes_rm(args: argparse.Namespace) -> int:
    async def body(client: UserClient) -> int:
        await client.delete_mode(name=args.name)
        print(f"mode {args.name} removed")
        return 0

    return _run(args, body)


# --- launch, stop, logs --------------------------------------------------------------------
