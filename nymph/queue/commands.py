"""User verbs over the queue API: ``providers``, ``modes``, ``launch``, ``launch-dockyard``,
``instances``, ``stop``, ``logs``.

The server URL and token come from ``--url`` / ``--token``, else ``NYMPH_URL`` /
``NYMPH_TOKEN``, else the ``.dreamrc`` ``server: {url, token}``; the namespace from
``--namespace`` (default ``default``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from nymph.client import DEFAULT_URL, QueueClient
from nymph.dockyard.spec.yamlio import load_file
from nymph.errors import ConfigError, NymphError
from nymph.launch.cli import read_script
from nymph.launch.config import load_dreamrc, mode_from_cli, parse_assignments, provider_from_cli
from nymph.launch.state import InstanceState, Reason

_STATES = [s.value for s in InstanceState]


class ProbeTimeout(NymphError):
    """No daemon finished a probe in time."""


def connection(args: argparse.Namespace) -> QueueClient:
    url = args.url or os.environ.get("NYMPH_URL")
    token = args.token or os.environ.get("NYMPH_TOKEN")
    if (url is None or token is None) and Path(args.dreamrc).expanduser().is_file():
        server = load_dreamrc(args.dreamrc).server
        url = url or server.get("url")
        token = token or server.get("token")
    return QueueClient(base_url=url or DEFAULT_URL, token=token, namespace=args.namespace)


def _run(args: argparse.Namespace, body: Callable[[QueueClient], Awaitable[int]]) -> int:
    async def main() -> int:
        async with connection(args) as client:
            return await body(client)

    return asyncio.run(main())


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def _when(ts: str) -> str:
    try:
        return datetime.fromisoformat(ts).astimezone().strftime("%Y-%m-%d %H:%M:%S")
    except ValueError:
        return ts


def _print_instances(items: Sequence[dict[str, Any]]) -> None:
    if not items:
        print("no instances")
        return
    rows = [
        (
            i["instanceId"],
            i["state"],
            i["reason"] or "",
            i["node"] or "",
            _when(i["launchedAt"]),
            i["message"],
        )
        for i in items
    ]
    print(_table(("INSTANCE", "STATE", "REASON", "NODE", "LAUNCHED", "MESSAGE"), rows))


def _failed(reason: str | None) -> bool:
    if reason is None:
        return False
    try:
        return Reason(reason).failed
    except ValueError:
        return True


# --- providers -----------------------------------------------------------------------------


def cmd_providers_add(args: argparse.Namespace) -> int:
    provider = provider_from_cli(args.name, launcher=args.launcher, kwargs=args.kwarg)

    async def body(client: QueueClient) -> int:
        await client.create_provider(
            name=provider.name, kwargs=provider.kwargs, dispatch=args.dispatch, replace=args.replace
        )
        print(f"provider {provider.name} saved in namespace {client.namespace}")
        return 0

    return _run(args, body)


def cmd_providers_list(args: argparse.Namespace) -> int:
    async def body(client: QueueClient) -> int:
        items = await client.list_providers()
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
        print(_table(("NAME", "LAUNCHER", "DISPATCH", "KUBE NAMESPACE", "CONTEXT"), rows))
        return 0

    return _run(args, body)


def cmd_providers_show(args: argparse.Namespace) -> int:
    async def body(client: QueueClient) -> int:
        print(yaml.safe_dump(await client.get_provider(name=args.name), sort_keys=False), end="")
        return 0

    return _run(args, body)


def cmd_providers_rm(args: argparse.Namespace) -> int:
    async def body(client: QueueClient) -> int:
        await client.delete_provider(name=args.name)
        print(f"provider {args.name} removed")
        return 0

    return _run(args, body)


def cmd_instances(args: argparse.Namespace) -> int:
    async def body(client: QueueClient) -> int:
        _print_instances(await client.list_instances(provider=args.provider, state=args.state))  # type: ignore[arg-type]
        return 0

    return _run(args, body)


def _print_checks(result: dict[str, Any] | None) -> bool:
    """Print a probe's checks; False if any failed."""
    all_ok = True
    checks = (result or {}).get("checks")
    if isinstance(checks, list):
        for check in checks:
            if not isinstance(check, dict):
                continue
            ok = bool(check.get("ok"))
            all_ok = all_ok and ok
            detail = check.get("detail") or ""
            print(
                f"  {'ok  ' if ok else 'FAIL'}  {check.get('name', '?')}" + (f": {detail}" if detail else "")
            )
    elif result:
        print(f"  result: {result}")
    if isinstance(result, dict) and result.get("ok") is False:
        all_ok = False
    return all_ok


def cmd_providers_test(args: argparse.Namespace) -> int:
    async def body(client: QueueClient) -> int:
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
        ok = _print_checks(task["result"]) and task["status"] == "done"
        if task["error"]:
            print(f"  error: {task['error']}")
        print(f"provider {args.name}: {'ok' if ok else 'FAILED'}")
        return 0 if ok else 1

    return _run(args, body)


# --- modes ---------------------------------------------------------------------------------


def cmd_modes_add(args: argparse.Namespace) -> int:
    mode = mode_from_cli(args.name, provider=args.provider, fields=args.field)

    async def body(client: QueueClient) -> int:
        await client.create_mode(
            name=mode.name, provider=mode.provider, fields=mode.fields, replace=args.replace
        )
        print(f"mode {mode.name} saved in namespace {client.namespace}")
        return 0

    return _run(args, body)


def cmd_modes_list(args: argparse.Namespace) -> int:
    async def body(client: QueueClient) -> int:
        items = await client.list_modes()
        if not items:
            print(f"no modes in namespace {client.namespace}")
            return 0
        rows = [(m["name"], m["provider"] or "", m["fields"].get("image", "")) for m in items]
        print(_table(("NAME", "PROVIDER", "IMAGE"), rows))
        return 0

    return _run(args, body)


def cmd_modes_show(args: argparse.Namespace) -> int:
    async def body(client: QueueClient) -> int:
        print(yaml.safe_dump(await client.get_mode(name=args.name), sort_keys=False), end="")
        return 0

    return _run(args, body)


def cmd_modes_rm(args: argparse.Namespace) -> int:
    async def body(client: QueueClient) -> int:
        await client.delete_mode(name=args.name)
        print(f"mode {args.name} removed")
        return 0

    return _run(args, body)


# --- launch, stop, logs --------------------------------------------------------------------


async def follow(
    client: QueueClient,
    *,
    provider: str,
    instance_id: str,
    poll_wait: float = 30.0,
    until_running: bool = False,
) -> int:
    """Print each state change as it happens until the instance stops (or, with
    ``until_running``, runs); 1 if it failed."""
    shown = 0
    version = -1
    while True:
        inst = await client.get_instance(
            provider=provider, instance_id=instance_id, after=version, wait=poll_wait
        )
        version = inst["version"]
        for entry in inst["history"][shown:]:
            reason = f" ({entry['reason']})" if entry["reason"] else ""
            message = f": {entry['message']}" if entry["message"] else ""
            print(f"{_when(entry['at'])}  {entry['state']}{reason}{message}", file=sys.stderr, flush=True)
        shown = len(inst["history"])
        if until_running and inst["state"] == InstanceState.RUNNING.value:
            return 0
        if inst["state"] == InstanceState.STOPPED.value:
            if _failed(inst["reason"]):
                print(f"{instance_id} failed: {inst['reason']}", file=sys.stderr)
                return 1
            return 0


def cmd_launch(args: argparse.Namespace) -> int:
    script = read_script(args.script)
    tags: dict[str, str] = {}
    for item in args.tag:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--tag {item!r}: expected KEY=VALUE")
        tags[key] = value
    env = parse_assignments(args.env, flag="--env")
    fields = parse_assignments(args.field, flag="--field")
    key = args.idempotency_key or str(uuid.uuid4())

    async def body(client: QueueClient) -> int:
        accepted = await client.launch(
            provider=args.provider,
            mode=args.mode,
            script=script,
            tags=tags,
            env=env,
            fields=fields,
            idempotency_key=key,
            retries=2,
        )
        print(accepted["instanceId"], flush=True)
        if not args.wait:
            return 0
        return await follow(client, provider=args.provider, instance_id=accepted["instanceId"])

    return _run(args, body)


def _read_mapping(path: str, *, what: str) -> dict[str, Any]:
    """A YAML file (anchors expanded) as a JSON-ready mapping; errors name the file."""
    doc = load_file(Path(path))
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{what} {path}: expected a mapping at the top level")
    if "defaults" in doc:
        raise ConfigError(
            f"{what} {path}: defaults: (file inheritance) is not followed for a launch a daemon "
            "renders; merge the parent files into this one"
        )
    try:
        json.dumps(doc, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"{what} {path}: holds a value JSON cannot carry ({exc}); quote dates and use string keys"
        ) from None
    return doc


def cmd_launch_dockyard(args: argparse.Namespace) -> int:
    recipe = _read_mapping(args.recipe, what="recipe")
    infra = _read_mapping(args.infra, what="--infra") if args.infra else None
    key = args.idempotency_key or str(uuid.uuid4())

    async def body(client: QueueClient) -> int:
        accepted = await client.launch_dockyard(
            provider=args.provider,
            recipe=recipe,
            infra=infra,
            overrides=args.set,
            idempotency_key=key,
            retries=2,
        )
        print(accepted["instanceId"], flush=True)
        if not args.wait:
            return 0
        return await follow(
            client, provider=args.provider, instance_id=accepted["instanceId"], until_running=True
        )

    return _run(args, body)


def cmd_stop(args: argparse.Namespace) -> int:
    async def body(client: QueueClient) -> int:
        await client.stop(provider=args.provider, instance_id=args.instance_id)
        print(f"stop requested for {args.instance_id}")
        return 0

    return _run(args, body)


def cmd_logs(args: argparse.Namespace) -> int:
    async def body(client: QueueClient) -> int:
        logs = await client.get_logs(provider=args.provider, instance_id=args.instance_id)
        if logs is None:
            print(
                f"no logs for {args.instance_id} yet: the daemon uploads them when the Pod is reaped",
                file=sys.stderr,
            )
            return 1
        sys.stdout.write(logs)
        return 0

    return _run(args, body)


# --- registration --------------------------------------------------------------------------


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
    p.add_argument("--dispatch", default="daemon", help="how launches reach the cluster (only: daemon)")
    p.add_argument("--replace", action="store_true", help="replace an existing provider of that name")
    p.set_defaults(func=cmd_providers_add)
    p = psub.add_parser("list", parents=[common], help="list providers")
    p.set_defaults(func=cmd_providers_list)
    for verb, func, text in (
        ("show", cmd_providers_show, "show a provider"),
        ("rm", cmd_providers_rm, "remove a provider"),
    ):
        p = psub.add_parser(verb, parents=[common], help=text)
        p.add_argument("name")
        p.set_defaults(func=func)
    p = psub.add_parser("instances", parents=[common], help="list a provider's instances")
    p.add_argument("provider", metavar="name")
    p.add_argument("--state", choices=_STATES)
    p.set_defaults(func=cmd_instances)
    p = psub.add_parser(
        "test",
        parents=[common],
        help="prove the path end to end with a dry-run probe",
        description="Queue a probe that a daemon runs as a server-side dry run, wait, print each check.",
    )
    p.add_argument("name")
    p.add_argument("--mode", help="mode whose Pod shape to probe (default: a tiny busybox Pod)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for a daemon (default 60)")
    p.set_defaults(func=cmd_providers_test)

    modes = sub.add_parser("modes", help="add, list, show and remove modes")
    msub = modes.add_subparsers(dest="modes_command", metavar="COMMAND", required=True)
    p = msub.add_parser(
        "add",
        parents=[common],
        help="add a mode",
        description="Example: nymph modes add k8s-gpu --provider my-cluster --field image=python:3.12-slim",
    )
    p.add_argument("name")
    p.add_argument("--provider", help="the provider this mode belongs to")
    p.add_argument(
        "--field",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Pod-shape field (repeatable; JSON/YAML values)",
    )
    p.add_argument("--replace", action="store_true", help="replace an existing mode of that name")
    p.set_defaults(func=cmd_modes_add)
    p = msub.add_parser("list", parents=[common], help="list modes")
    p.set_defaults(func=cmd_modes_list)
    for verb, func, text in (("show", cmd_modes_show, "show a mode"), ("rm", cmd_modes_rm, "remove a mode")):
        p = msub.add_parser(verb, parents=[common], help=text)
        p.add_argument("name")
        p.set_defaults(func=func)

    p = sub.add_parser(
        "launch",
        parents=[common],
        help="queue a launch; prints the instance id",
        description="Example: nymph launch my-cluster --mode k8s-gpu --script train.py --tag team=ml --wait",
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
    p.add_argument("--idempotency-key", help="retry-safe key (default: a fresh UUID, reused on retries)")
    p.add_argument("--wait", action="store_true", help="show each state change; exit 1 if the run failed")
    p.set_defaults(func=cmd_launch)

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
    p.set_defaults(func=cmd_launch_dockyard)

    p = sub.add_parser("instances", parents=[common], help="list a provider's instances")
    p.add_argument("provider")
    p.add_argument("--state", choices=_STATES)
    p.set_defaults(func=cmd_instances)

    p = sub.add_parser("stop", parents=[common], help="stop an instance")
    p.add_argument("provider")
    p.add_argument("instance_id", metavar="ID")
    p.set_defaults(func=cmd_stop)

    p = sub.add_parser("logs", parents=[common], help="print an instance's logs (uploaded when reaped)")
    p.add_argument("provider")
    p.add_argument("instance_id", metavar="ID")
    p.set_defaults(func=cmd_logs)
