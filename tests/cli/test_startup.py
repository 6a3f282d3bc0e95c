"""Building the ``nymph`` parser (``nymph --help``, and every command before its handler runs)
loads no server, daemon or Kubernetes client: those are imported by the commands that use them.
A user command (``nymph instances``, ``nymph launch``) builds its own area's parsers only and
loads neither dockyard nor pydantic, omegaconf, structlog or the dispatch client, before or
while it runs."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import platformdirs
import pytest

HEAVY = (
    "nymph.queue",
    "nymph.daemon",
    "aiohttp",  # aiohttp.web included
    "kubernetes_asyncio",
    "nymph.client",
    "nymph.localcluster",
    "nymph.dockyard.live",
    "pydantic",
    "omegaconf",
    "structlog",
)

PROBE = textwrap.dedent(
    """
    import contextlib, io, json, sys
    import nymph.cli
    with contextlib.redirect_stdout(io.StringIO()) as out:
        try:
            nymph.cli.main(["--help"])
        except SystemExit as exc:
            code = exc.code
    print(json.dumps({"code": code, "help": out.getvalue(), "modules": sorted(sys.modules)}))
    """
)


def test_help_in_a_fresh_interpreter_loads_no_queue_daemon_web_server_or_kube_client() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True
    )
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["code"] == 0 and "results" in got["help"] and "dockyard" in got["help"]
    loaded = [m for m in got["modules"] if any(m == h or m.startswith(h + ".") for h in HEAVY)]
    assert loaded == []


#: What ``nymph instances --help`` and ``nymph launch --help`` do not import, nor their handlers.
USER_HEAVY = (
    "pydantic",
    "omegaconf",
    "nymph.dockyard",
    "nymph.queue",
    "nymph.daemon",
    "aiohttp.web",
    "kubernetes_asyncio",
    "nymph.localcluster",
    "structlog",
    "rich",
    "nymph.client.dispatch",
)
#: ... and what their --help does not import either (the handler needs the HTTP client).
HELP_HEAVY = (*USER_HEAVY, "aiohttp", "nymph.client", "nymph.launch", "yaml", "asyncio")

USER_PROBE = textwrap.dedent(
    """
    import contextlib, importlib, io, json, sys
    import nymph.cli
    argv = json.loads(sys.argv[1])
    with contextlib.redirect_stdout(io.StringIO()) as out:
        try:
            nymph.cli.main(argv)
        except SystemExit as exc:
            code = exc.code
    helped = sorted(sys.modules)
    for name in json.loads(sys.argv[2]):  # the handlers the command runs
        importlib.import_module(name)
    print(json.dumps({"code": code, "help": out.getvalue(), "helped": helped, "ran": sorted(sys.modules)}))
    """
)


def _loaded(modules: list[str], heavy: tuple[str, ...]) -> list[str]:
    return [m for m in modules if any(m == h or m.startswith(h + ".") for h in heavy)]


@pytest.mark.parametrize(
    ("command", "handlers"),
    [
        ("instances", ["nymph.cli.userverbs", "nymph.client.logs"]),
        ("launch", ["nymph.cli.userverbs", "nymph.launch.script", "nymph.kube.slim"]),
    ],
)
def test_a_user_command_loads_only_what_it_needs(command: str, handlers: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", USER_PROBE, json.dumps([command, "--help"]), json.dumps(handlers)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["code"] == 0 and f"usage: nymph {command}" in got["help"] and "exit codes:" in got["help"]
    assert _loaded(got["helped"], HELP_HEAVY) == []
    assert "nymph.cli.dockyard" not in got["helped"] and "nymph.cli.render" not in got["helped"]
    assert _loaded(got["ran"], USER_HEAVY) == []


def test_each_command_is_built_by_the_area_that_registers_it() -> None:
    """``nymph COMMAND`` builds only the area in :data:`nymph.cli.COMMAND_AREAS`; that table
    names every command the areas register, each to its own area."""
    import argparse
    import importlib

    from nymph.cli import _AREAS, COMMAND_AREAS, command_of

    registered: dict[str, str] = {}
    for area in _AREAS:
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(area).register(sub)
        registered |= dict.fromkeys(sub.choices, area)
    assert registered == COMMAND_AREAS
    assert command_of(["--log-level", "debug", "instances", "kind"]) == "instances"
    assert command_of(["--log-format=json", "launch"]) == "launch"
    assert command_of(["--help"]) is None


def test_the_parser_knows_the_instance_states() -> None:
    from nymph.cli.user import STATES
    from nymph.launch.state import InstanceState

    assert tuple(s.value for s in InstanceState) == STATES


def test_the_parser_defaults_match_the_queue_it_describes() -> None:
    """The queue command's parser names the queue's defaults without importing the queue."""
    from nymph.cli import queue as cli_queue
    from nymph.client import DEFAULT_URL
    from nymph.queue.http.serve import DEFAULT_LISTEN, default_db_path
    from nymph.queue.models import Role

    assert tuple(r.value for r in Role) == cli_queue.ROLES
    assert cli_queue.default_db_path() == default_db_path()
    assert platformdirs.user_data_path("nymph") in cli_queue.default_db_path().parents
    assert f"http://{DEFAULT_LISTEN}" == DEFAULT_URL


def test_the_dockyard_parser_offers_every_log_source() -> None:
    """``nymph dockyard logs --source`` lists the renderer's log sources without importing it."""
    from nymph.cli.dockyard_live import LOG_SOURCES
    from nymph.dockyard.render.plan import LogSource

    assert tuple(s.value for s in LogSource) == LOG_SOURCES


RUN_PROBE = textwrap.dedent(
    """
    import contextlib, io, json, sys
    import nymph.cli
    with contextlib.redirect_stderr(io.StringIO()) as err:
        try:
            code = nymph.cli.main(json.loads(sys.argv[1]))
        except SystemExit as exc:
            code = exc.code
    print(json.dumps({"code": code, "err": err.getvalue(), "modules": sorted(sys.modules)}))
    """
)


@pytest.mark.parametrize(
    "argv",
    [
        ["instances", "kind"],
        ["launch", "kind", "--mode", "m", "--script", "-"],
        ["providers", "list"],
    ],
)
def test_a_plain_user_call_goes_out_without_aiohttp(argv: list[str]) -> None:
    """A command that makes plain calls to the queue (a list, a launch) sends them through the
    standard library's HTTP client: aiohttp is never imported, and a queue that cannot be reached
    still gets the CLI's own message and exit code."""
    done = subprocess.run(
        [sys.executable, "-c", RUN_PROBE, json.dumps([*argv, "--url", "http://127.0.0.1:9"])],
        input="echo hi\n",
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["code"] == 2, got["err"]
    assert "cannot reach the queue at http://127.0.0.1:9" in got["err"]
    # nymph.cli puts the light placeholders of nymph.kube.slim in place; no real client module loads
    light = tuple(h for h in USER_HEAVY if h != "kubernetes_asyncio")
    assert _loaded(got["modules"], ("aiohttp", *light)) == []
    assert [m for m in got["modules"] if m.startswith("kubernetes_asyncio.client.models.")] == []
