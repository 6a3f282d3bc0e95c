"""Building the ``nymph`` parser (``nymph --help``, and every command before its handler runs)
loads no server, daemon or Kubernetes client: those are imported by the commands that use them."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import platformdirs

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
