"""The handlers of the user verbs over the queue API: ``providers``, ``modes``, ``launch``,
``launch-dockyard``, ``instances``, ``stop``, ``logs`` (their parsers are in :mod:`nymph.cli.user`).

The server URL and token come from ``--url`` / ``--token``, else ``NYMPH_URL`` /
``NYMPH_TOKEN``, else the ``.dreamrc`` ``server: {url, token}``; the namespace from
``--namespace`` (default ``default``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from nymph.cli.output import emit
from nymph.cli.paging import fetch
from nymph.cli.userview import (
    INTERRUPTED_EXIT,
    WAIT_TIMEOUT_EXIT,
    follow,
    no_log_yet,
    print_instances,
    still_there,
)
from nymph.client import QueueAuthError, QueueError, QueueNotFound, UserClient, safe_url
from nymph.client.logs import follow_log
from nymph.client.paging import Page
from nymph.errors import ConfigError, NymphError
from nymph.launch.dreamrc import load_server, parse_assignments
from nymph.launch.durations import format_duration, parse_duration
from nymph.launch.names import parse_labels
from nymph.launch.script import read_script
from nymph.netaddr import DEFAULT_URL
from nymph.protocol import InstanceJSON


class ProbeTimeout(NymphError):
    """No daemon finished a probe in time."""


def _server(args: argparse.Namespace) -> tuple[str, str, str | None, str]:
    """(url, where the URL came from, token, where the token came from)."""
    url, url_from = args.url or None, "--url"
    if url is None and os.environ.get("NYMPH_URL"):
        url, url_from = os.environ["NYMPH_URL"], "NYMPH_URL"
    token, token_from = args.token or None, "--token"
    if token is None and os.environ.get("NYMPH_TOKEN"):
        token, token_from = os.environ["NYMPH_TOKEN"], "NYMPH_TOKEN"
    if (url is None or token is None) and Path(args.dreamrc).expanduser().is_file():
        server = load_server(args.dreamrc)
        if url is None and server.get("url"):
            url, url_from = str(server["url"]), f"{args.dreamrc} server.url"
        if token is None and server.get("token"):
            token, token_from = str(server["token"]), f"{args.dreamrc} server.token"
    if url is None:
        url, url_from = DEFAULT_URL, "the default"
    return url, url_from, token or None, token_from if token else ""


def check_url(url: str, *, source: str) -> None:
    """A queue URL is ``http(s)://HOST:PORT`` (a path prefix allowed): a ConfigError saying what
    to set for one without a scheme or one naming the API's ``/v1`` itself."""
    example = f"e.g. {DEFAULT_URL}"
    if not url.lower().startswith(("http://", "https://")):
        raise ConfigError(
            f"queue URL {safe_url(url)!r} (from {source}) has no http:// or https://: set it to "
            f"http://{url.split('://', 1)[-1]}" + ("" if "://" in url else f" ({example})")
        )
    path = urlsplit(url).path.rstrip("/")
    if path == "/v1" or path.endswith("/v1") or "/v1/" in path:
        root = safe_url(url)[: safe_url(url).rfind("/v1")]
        raise ConfigError(
            f"queue URL {safe_url(url)!r} (from {source}) names the API path: set the queue's root "
            f"URL, without /v1 ({root or example})"
        )


def connection(args: argparse.Namespace) -> UserClient:
    url, url_from, token, _ = _server(args)
    check_url(url, source=url_from)
    return UserClient(base_url=url, token=token, namespace=args.namespace, light=True)


def _no_token(args: argparse.Namespace) -> str:
    return (
        "set NYMPH_TOKEN, pass --token, or write server: {token: ...} in "
        f"{args.dreamrc}; an operator creates one with 'nymph queue token create --role user'"
    )


def _run(args: argparse.Namespace, body: Callable[[UserClient], Awaitable[int]]) -> int:
    """Run ``body`` with a client of the queue; a refused or missing token and a URL that is not
    a nymph queue become errors that say what to set."""
    url, url_from, token, token_from = _server(args)

    async def main() -> int:
        async with connection(args) as client:
            try:
                return await body(client)
            except QueueAuthError as exc:
                if exc.status != 401:
                    raise
                if token is None:
                    raise ConfigError(
                        f"the queue at {safe_url(url)} needs a token (HTTP 401): {_no_token(args)}"
                    ) from None
                raise ConfigError(
                    f"the queue at {safe_url(url)} refused the token from {token_from}: {exc.detail} "
                    f"(HTTP 401); {_no_token(args).replace('set ', 'set a valid ', 1)}"
                ) from None
            except QueueNotFound as exc:
                if exc.code is not None:
                    raise  # the queue's own answer: no such provider, mode, instance ...
                raise QueueError(
                    f"{safe_url(url)} (from {url_from}) answered HTTP 404 on the queue API: it is not "
                    f"a nymph queue; set the URL of 'nymph queue serve' (e.g. {DEFAULT_URL})",
                    status=404,
                ) from None

    return asyncio.run(main())


# --- providers -----------------------------------------------------------------------------


def cmd_instances(args: argparse.Namespace) -> int:
    async def body(client: UserClient) -> int:
        def page(limit: int | None, token: str | None) -> Awaitable[Page[InstanceJSON]]:
            return client.instances_page(
                provider=args.provider, state=args.state, limit=limit, continue_=token
            )

        command = ["instances", args.provider, *(["--state", args.state] if args.state else [])]
        items = await fetch(args, page, what="instances", first_page=True, command=command)
        if not emit(args, items):
            print_instances(items)
        return 0

    return _run(args, body)


def cmd_launch(args: argparse.Namespace) -> int:
    if getattr(args, "count", None) is not None or getattr(args, "items", None):
        from nymph.cli.usergroups import cmd_launch_group

        return cmd_launch_group(args)
    script = read_script(args.script)
    tags = parse_labels(args.tag)
    env = parse_assignments(args.env, flag="--env")
    fields = parse_assignments(args.field, flag="--field")
    if args.max_runtime is not None:
        fields["max_runtime"] = args.max_runtime  # checked by the queue, which names the field
    key = args.idempotency_key or str(uuid.uuid4())
    timeout = None if args.timeout is None else parse_duration(args.timeout, "--timeout")
    launched: list[str] = []

    async def body(client: UserClient) -> int:
        accepted = await client.launch(
            provider=args.provider,
            mode=args.mode,
            script=script,
            tags=tags,
            env=env,
            fields=fields,
            idempotency_key=key,
            retries=2,
            priority=args.priority,
        )
        print(accepted["instanceId"], flush=True)
        if not args.wait:
            return 0
        iid = accepted["instanceId"]
        launched.append(iid)
        try:
            return await asyncio.wait_for(_wait(client, args, iid), timeout)
        except TimeoutError:
            inst = await client.get_instance(provider=args.provider, instance_id=iid)
            print(
                f"nymph: gave up waiting after {format_duration(timeout or 0)}: {still_there(inst)}",
                file=sys.stderr,
            )
            return WAIT_TIMEOUT_EXIT

    try:
        return _run(args, body)
    except KeyboardInterrupt:
        if not launched:
            raise
        print(
            f"nymph: interrupted: {launched[0]} was launched and goes on without this command; "
            f"stop it with: nymph stop {args.provider} {launched[0]}"
            + ("" if args.namespace == "default" else f" --namespace {args.namespace}"),
            file=sys.stderr,
        )
        return INTERRUPTED_EXIT


async def _wait(client: UserClient, args: argparse.Namespace, iid: str) -> int:
    """``launch --wait``: follow the launch's attempts (a retry policy may launch it again,
    ``retriedAs``) to the last one; its exit status is the command's."""
    while True:
        code = await _wait_one(client, args, iid)
        inst = await client.get_instance(provider=args.provider, instance_id=iid)
        nxt = inst.get("retriedAs")
        if not nxt:
            return code
        print(f"nymph: {iid} is retried as {nxt}; following it", file=sys.stderr, flush=True)
        iid = nxt


async def _wait_one(client: UserClient, args: argparse.Namespace, iid: str) -> int:
    """One attempt: the states (and, unless ``--quiet``, the output) until it stops."""
    if args.quiet:
        return await follow(client, provider=args.provider, instance_id=iid, job_exit=True)
    output = asyncio.create_task(_print_log(client, provider=args.provider, instance_id=iid))
    try:
        code = await follow(client, provider=args.provider, instance_id=iid, job_exit=True)
        # The log ends once all of it arrived (or soon after the stop when none comes).
        with contextlib.suppress(TimeoutError, QueueError):
            await asyncio.wait_for(asyncio.shield(output), _LOG_TAIL_SECONDS)
    finally:
        output.cancel()
        with contextlib.suppress(asyncio.CancelledError, QueueError):
            await output
    return code


#: After the instance stopped, ``launch --wait`` waits this long at most for the rest of its log.
_LOG_TAIL_SECONDS = 20.0


async def _print_log(client: UserClient, *, provider: str, instance_id: str) -> int:
    def write(data: bytes) -> None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()

    return await follow_log(client, provider=provider, instance_id=instance_id, write=write)


def _read_mapping(path: str, *, what: str) -> dict[str, Any]:
    """A YAML file (anchors expanded) as a JSON-ready mapping; errors name the file."""
    from nymph.dockyard.spec.yamlio import load_file

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

    async def body(client: UserClient) -> int:
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
    async def body(client: UserClient) -> int:
        # The API answers 204 for a stopped instance too: read its state first to say which.
        before = await client.get_instance(provider=args.provider, instance_id=args.instance_id)
        await client.stop(provider=args.provider, instance_id=args.instance_id)
        state, reason = before.get("state"), before.get("reason")
        if state == "stopped":
            print(f"{args.instance_id} was already stopped" + (f" ({reason})" if reason else ""))
        elif state == "stopping":
            print(f"{args.instance_id} was already stopping")
        else:
            print(f"stop requested for {args.instance_id}")
        return 0

    return _run(args, body)


#: How long ``logs -f`` waits, once the log is over, for the instance to be reported stopped.
LOG_END_GRACE = 30.0


async def _await_stopped(client: UserClient, *, provider: str, instance_id: str, limit: float) -> None:
    """Return when the instance is stopped, or after ``limit`` seconds: the log of a job ends
    when its container does, a moment before the daemon reports the end (and its results), so a
    script's next command after ``logs -f`` sees the job over."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    version = -1
    while (left := deadline - loop.time()) > 0:
        inst = await client.get_instance(
            provider=provider, instance_id=instance_id, after=version, wait=min(left, 10.0)
        )
        if inst["state"] == "stopped":
            return
        version = inst["version"]


def cmd_logs(args: argparse.Namespace) -> int:
    async def body(client: UserClient) -> int:
        if args.follow:
            await _print_log(client, provider=args.provider, instance_id=args.instance_id)
            await _await_stopped(
                client, provider=args.provider, instance_id=args.instance_id, limit=LOG_END_GRACE
            )
            return 0
        logs = await client.get_logs(provider=args.provider, instance_id=args.instance_id)
        if logs is None:
            # Nothing logged is not an error (exit 0); the note says why: a Pod that cannot
            # start (its reason and message), a job that never ran, or nothing printed yet.
            inst = await client.get_instance(provider=args.provider, instance_id=args.instance_id)
            print(no_log_yet(inst), file=sys.stderr)
            return 0
        sys.stdout.write(logs)
        return 0

    return _run(args, body)
