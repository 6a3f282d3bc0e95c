"""The handlers of ``nymph group show|wait|stop`` and of ``nymph launch --count/--items`` (their
parsers are in :mod:`nymph.cli.groupverbs` and :mod:`nymph.cli.user`)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from nymph.cli.exitcodes import JOB_FAILED, OK, WAIT_TIMEOUT_EXIT
from nymph.cli.output import emit
from nymph.cli.userverbs import _run
from nymph.cli.userview import print_instances
from nymph.client import UserClient
from nymph.errors import ConfigError
from nymph.launch.dreamrc import parse_assignments
from nymph.launch.durations import parse_duration
from nymph.launch.names import parse_labels
from nymph.launch.script import read_script

#: How often ``group wait`` reads the group.
POLL_SECONDS = 1.0
_ITEM_KEYS = ("env", "tags", "fields", "priority")


def read_items(path: str) -> list[dict[str, Any]]:
    """The JSON lines of ``--items FILE`` (blank lines skipped); errors name the line."""
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"--items {path}: cannot read it ({exc.strerror or exc})") from None
    items: list[dict[str, Any]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--items {path}, line {number}: not JSON ({exc.msg})") from None
        if not isinstance(item, dict):
            raise ConfigError(
                f'--items {path}, line {number}: expected a JSON object like {{"env": {{...}}}}'
            )
        unknown = sorted(set(item) - set(_ITEM_KEYS))
        if unknown:
            raise ConfigError(
                f"--items {path}, line {number}: {unknown[0]!r} is not one of {', '.join(_ITEM_KEYS)}"
            )
        items.append(item)
    if not items:
        raise ConfigError(f"--items {path}: no launches in it (one JSON object a line)")
    return items


def group_body(args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {"mode": args.mode, "script": read_script(args.script)}
    for key, value in (
        ("tags", parse_labels(args.tag)),
        ("env", parse_assignments(args.env, flag="--env")),
        ("fields", parse_assignments(args.field, flag="--field")),
    ):
        if value:
            body[key] = value
    if args.max_runtime is not None:
        body.setdefault("fields", {})["max_runtime"] = args.max_runtime
    if args.priority is not None:
        body["priority"] = args.priority
    if args.items:
        body["items"] = read_items(args.items)
    else:
        body["count"] = args.count
    return body


def cmd_launch_group(args: argparse.Namespace) -> int:
    body = group_body(args)
    key = args.idempotency_key or str(uuid.uuid4())
    timeout = None if args.timeout is None else parse_duration(args.timeout, "--timeout")

    async def run(client: UserClient) -> int:
        accepted = await client.launch_group(
            provider=args.provider, body=body, idempotency_key=key, retries=2
        )
        print(accepted["groupId"], flush=True)
        print(f"{accepted['total']} launches queued as group {accepted['groupId']}", file=sys.stderr)
        if not args.wait:
            return OK
        return await _wait(client, accepted["groupId"], timeout=timeout)

    return _run(args, run)


def _line(group: dict[str, Any]) -> str:
    counts = ", ".join(f"{k} {v}" for k, v in group["counts"].items()) or "none"
    reasons = ", ".join(f"{k} {v}" for k, v in group["reasons"].items())
    return f"{group['total']} launches: {counts}" + (f" ({reasons})" if reasons else "")


def cmd_group_show(args: argparse.Namespace) -> int:
    async def run(client: UserClient) -> int:
        group = await client.get_group(group_id=args.group_id)
        members = await client.group_instances(group_id=args.group_id) if args.instances else None
        if emit(args, group if members is None else {**group, "instances": members}):
            return OK
        print(f"group {group['groupId']} of provider {group['provider']}, created {group['createdAt']}")
        print(_line(group))
        if "stopRequestedAt" in group:
            print(f"stop requested at {group['stopRequestedAt']}")
        if members is not None:
            print_instances([dict(m) for m in members])
        return OK

    return _run(args, run)


async def _wait(client: UserClient, group_id: str, *, timeout: float | None) -> int:
    deadline = None if timeout is None else time.monotonic() + timeout
    last = ""
    while True:
        group = await client.get_group(group_id=group_id)
        line = _line(group)
        if line != last:
            print(line, file=sys.stderr, flush=True)
            last = line
        if sum(group["counts"].values()) - group["counts"].get("stopped", 0) == 0:
            completed = group["reasons"].get("Completed", 0)
            if completed == sum(group["counts"].values()):
                print(f"group {group_id}: all {completed} completed")
                return OK
            print(f"group {group_id}: not all completed: {line}")
            return JOB_FAILED
        if deadline is not None and time.monotonic() >= deadline:
            print(
                f"nymph: gave up waiting: {line}; stop it with: nymph group stop {group_id}", file=sys.stderr
            )
            return WAIT_TIMEOUT_EXIT
        await asyncio.sleep(POLL_SECONDS)


def cmd_group_wait(args: argparse.Namespace) -> int:
    timeout = None if args.timeout is None else parse_duration(args.timeout, "--timeout")

    async def run(client: UserClient) -> int:
        return await _wait(client, args.group_id, timeout=timeout)

    return _run(args, run)


def cmd_group_stop(args: argparse.Namespace) -> int:
    async def run(client: UserClient) -> int:
        await client.stop_group(group_id=args.group_id)
        group = await client.get_group(group_id=args.group_id)
        print(f"stop requested for group {args.group_id}: {_line(group)}")
        return OK

    return _run(args, run)
