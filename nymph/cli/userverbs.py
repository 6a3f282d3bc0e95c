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
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from nymph.cli.userview import follow, print_checks, print_instances, table
from nymph.client import QueueAuthError, QueueError, QueueNotFound, UserClient, safe_url
from nymph.client.logs import follow_log
from nymph.errors import ConfigError, NymphError
from nymph.launch.dreamrc import load_dreamrc, mode_from_cli, parse_assignments, provider_from_cli
from nymph.launch.names import parse_labels
from nymph.launch.script import read_script
from nymph.netaddr import DEFAULT_URL


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
        server = load_dreamrc(args.dreamrc).server
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
    return UserClient(base_url=url, token=token, namespace=args.namespace)


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
        print(table(("NAME", "LAUNCHER", "DISPATCH", "KUBE NAMESPACE", "CONTEXT"), rows))
        return 0

    return _run(args, body)


def cmd_providers_show(args: argparse.Namespace) -> int:
    async def body(client: UserClient) -> int:
        provider = await client.get_provider(name=args.name)
        kwargs = dict(provider.get("kwargs") or {})
        if provider.get("dispatch") == "direct" or "kubeconfig" in kwargs:
            kwargs["kubeconfig"] = describe_kubeconfig(kwargs.get("kubeconfig"))
        print(yaml.safe_dump({**provider, "kwargs": kwargs}, sort_keys=False), end="")
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


def cmd_instances(args: argparse.Namespace) -> int:
    async def body(client: UserClient) -> int:
        print_instances(await client.list_instances(provider=args.provider, state=args.state))  # type: ignore[arg-type]
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
        items = await client.list_modes()
        if not items:
            print(f"no modes in namespace {client.namespace}")
            return 0
        rows = [(m["name"], m["provider"] or "", m["fields"].get("image", "")) for m in items]
        print(table(("NAME", "PROVIDER", "IMAGE"), rows))
        return 0

    return _run(args, body)


def cmd_modes_show(args: argparse.Namespace) -> int:
    async def body(client: UserClient) -> int:
        print(yaml.safe_dump(await client.get_mode(name=args.name), sort_keys=False), end="")
        return 0

    return _run(args, body)


def cmd_modes_rm(args: argparse.Namespace) -> int:
    async def body(client: UserClient) -> int:
        await client.delete_mode(name=args.name)
        print(f"mode {args.name} removed")
        return 0

    return _run(args, body)


# --- launch, stop, logs --------------------------------------------------------------------


def cmd_launch(args: argparse.Namespace) -> int:
    script = read_script(args.script)
    tags = parse_labels(args.tag)
    env = parse_assignments(args.env, flag="--env")
    fields = parse_assignments(args.field, flag="--field")
    key = args.idempotency_key or str(uuid.uuid4())

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
        )
        print(accepted["instanceId"], flush=True)
        if not args.wait:
            return 0
        iid = accepted["instanceId"]
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

    return _run(args, body)


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


def cmd_logs(args: argparse.Namespace) -> int:
    async def body(client: UserClient) -> int:
        if args.follow:
            await _print_log(client, provider=args.provider, instance_id=args.instance_id)
            return 0
        logs = await client.get_logs(provider=args.provider, instance_id=args.instance_id)
        if logs is None:
            print(
                f"no logs for {args.instance_id} yet: the job has printed nothing the queue has "
                "(use -f to wait for it)",
                file=sys.stderr,
            )
            return 1
        sys.stdout.write(logs)
        return 0

    return _run(args, body)
