"""Handlers of ``nymph quota`` (see :mod:`nymph.cli.quota`)."""

from __future__ import annotations

import argparse
from typing import Any

from nymph.cli.output import emit
from nymph.cli.userverbs import _run
from nymph.cli.userview import table
from nymph.client import UserClient
from nymph.errors import ConfigError
from nymph.launch.durations import format_duration

_NONE = ("none", "null", "")


def _number(text: str, flag: str) -> int | float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{flag} {text!r} is not a number; e.g. {flag} 2") from None
    return int(value) if value.is_integer() else value


def _count(text: str, flag: str) -> int:
    if not text.isdigit():
        raise ConfigError(f"{flag} {text!r} is not a whole number; e.g. {flag} 50, or {flag} none")
    return int(text)


def settings_from(args: argparse.Namespace) -> dict[str, Any]:
    """The PUT body the flags ask for (only the flags given; 'none' removes a limit)."""
    body: dict[str, Any] = {}
    if args.weight is not None:
        body["weight"] = None if args.weight.lower() in _NONE else _number(args.weight, "--weight")
    if args.max_running is not None:
        body["maxRunning"] = (
            None if args.max_running.lower() in _NONE else _count(args.max_running, "--max-running")
        )
    resources = {
        resource: None if value.lower() in _NONE else value
        for resource, value in (("cpu", args.cpu), ("memory", args.memory), ("nvidia.com/gpu", args.gpu))
        if value is not None
    }
    if resources:
        body["resources"] = resources
    for key, value in (("maxRuntime", args.max_runtime), ("defaultRuntime", args.default_runtime)):
        if value is not None:
            body[key] = None if value.lower() in _NONE else value
    return body


def _limit(value: object) -> str:
    return "-" if value is None else str(value)


def _runtime(value: object) -> str:
    return "-" if not isinstance(value, int) else format_duration(value)


def _rows(quotas: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for q in quotas:
        usage = q.get("usage") or {}
        held = usage.get("resources") or {}
        caps = q.get("resources") or {}
        resources = (
            ", ".join(f"{name} {held.get(name, '0')}/{cap}" for name, cap in sorted(caps.items()))
            or ", ".join(f"{name} {amount}" for name, amount in sorted(held.items()))
            or "-"
        )
        running = f"{usage.get('running', 0)}/{_limit(q.get('maxRunning'))}"
        rows.append(
            [
                str(q["namespace"]),
                str(q.get("weight", 1)),
                running,
                resources,
                _runtime(q.get("maxRuntime")),
                _runtime(q.get("defaultRuntime")),
            ]
        )
    return rows


_HEADER = ["NAMESPACE", "WEIGHT", "RUNNING/MAX", "RESOURCES (HELD/CAP)", "MAX RUNTIME", "DEFAULT RUNTIME"]


def cmd_quota_set(args: argparse.Namespace) -> int:
    body = settings_from(args)
    if not body:
        raise ConfigError(
            "nothing to set: give at least one of --weight, --max-running, --cpu, --memory, --gpu, "
            "--max-runtime, --default-runtime (see nymph quota set --help)"
        )

    async def run(client: UserClient) -> int:
        answer = await client.set_quota(body, namespace=args.target)
        print(table(_HEADER, _rows([answer])))
        return 0

    return _run(args, run)


def cmd_quota_show(args: argparse.Namespace) -> int:
    async def run(client: UserClient) -> int:
        if args.target:
            quota = await client.get_quota(namespace=args.target)
            if emit(args, quota):
                return 0
            quotas = [quota]
        else:
            quotas = await client.list_quotas()
            if emit(args, quotas):
                return 0
            if not quotas:
                print("no namespace has a quota or running launches yet")
                return 0
        print(table(_HEADER, _rows(quotas)))
        return 0

    return _run(args, run)
