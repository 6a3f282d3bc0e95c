"""The scoreboard stopped half-way (make's SIGTERM when a run is cut short) leaves nothing
running: its control plane, queues and daemons all stop, it exits 143 and writes no results."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.harness import REPO
from tests.support.hygiene_plugin import track

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(240)]

MARKER = "NYMPH_BENCH_STOP_TEST"


def _carrying(token: str) -> dict[int, str]:
    """Every live process whose environment holds ``MARKER=token``: pid -> command line."""
    needle = f"{MARKER}={token}".encode()
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            found[int(entry.name)] = (
                (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            )
        except OSError:  # gone meanwhile, or a kernel thread
            continue
    return found


def _wait_for(check: Callable[[], bool], *, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return False


def test_a_sigterm_mid_run_stops_every_process_the_scoreboard_started(tmp_path: Path) -> None:
    token = uuid.uuid4().hex
    out = tmp_path / "bench-results.json"
    with (tmp_path / "bench.log").open("wb") as log:
        bench = track(
            subprocess.Popen(
                [sys.executable, str(REPO / "benchmarks" / "daemon_bench.py"), "--smoke", "--out", str(out)],
                cwd=REPO,
                env={**os.environ, MARKER: token},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    # Its control plane is up and nymph's first queue is serving: mid-run.
    assert _wait_for(lambda: any("queue serve" in cmd for cmd in _carrying(token).values()), timeout=150), (
        tmp_path / "bench.log"
    ).read_text()[-2000:]
    started = _carrying(token)
    assert any("kube-apiserver" in cmd for cmd in started.values())
    bench.send_signal(signal.SIGTERM)
    assert bench.wait(timeout=90) == 143
    assert _wait_for(lambda: not _carrying(token), timeout=15), _carrying(token)
    assert not out.exists()
