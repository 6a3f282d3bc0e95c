"""The hygiene plugin fails a run that leaves processes behind, names them, and kills them."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.inner_pytest import REPO, run_inner


def run(tmp_path: Path, body: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return run_inner(tmp_path, body, "-p", "tests.support.hygiene_plugin", *extra)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


LEAKY = """
import subprocess

def test_leaks_a_child():
    subprocess.Popen(["sleep", "60"])  # never waited for

def test_leaks_an_orphan():
    # the shell exits at once: its sleep is re-parented away from pytest, found by the marker
    subprocess.run(["sh", "-c", "sleep 61 >/dev/null 2>&1 &"], check=True)
"""


@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["one-process", "xdist-workers"])
def test_a_leaked_process_fails_the_run_is_named_and_killed(tmp_path: Path, workers: tuple[str, ...]) -> None:
    """Also when the tests run on pytest-xdist workers: a worker hands its leaks to the main
    process, which fails the run and names them."""
    res = run(tmp_path, LEAKY, *workers)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "2 passed" in res.stdout  # the tests themselves pass: the leak alone fails the run
    assert "processes left running after the tests" in res.stdout
    leaked = dict(re.findall(r"pid (\d+): (sleep 6[01])", res.stdout))
    assert sorted(leaked.values()) == ["sleep 60", "sleep 61"], res.stdout
    deadline = time.monotonic() + 5
    while any(_alive(int(pid)) for pid in leaked) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(int(pid)) for pid in leaked)


TIDY = """
import subprocess
import pytest
from tests.support.hygiene_plugin import track

def test_waits_for_what_it_starts():
    subprocess.run(["true"], check=True)

def test_tracked_process_is_killed_when_the_test_fails():
    track(subprocess.Popen(["sleep", "62"], start_new_session=True))
    pytest.fail("boom")
"""


def test_a_run_that_cleans_up_passes_and_tracked_processes_die_with_their_test(tmp_path: Path) -> None:
    res = run(tmp_path, TIDY)
    assert res.returncode == 1, res.stdout + res.stderr  # one test fails on purpose ...
    assert "1 failed, 1 passed" in res.stdout
    assert "left running" not in res.stdout  # ... but nothing leaked
    assert "sleep 62" not in res.stdout


STOPPED = """
import signal
import subprocess
import time
from pathlib import Path

import pytest

def test_takes_the_handler_away():
    # as asyncio's remove_signal_handler does: the plugin handles SIGTERM again after it
    signal.signal(signal.SIGTERM, signal.SIG_DFL)

@pytest.fixture(scope="session")
def server():
    proc = subprocess.Popen(["sleep", "63"], start_new_session=True)
    Path("server.pid").write_text(str(proc.pid))
    yield proc
    proc.kill()
    proc.wait()
    Path("torn-down").write_text("yes")

def test_runs_until_stopped(server):
    Path("ready").write_text("")
    time.sleep(60)
"""


def test_a_sigterm_to_the_run_tears_its_fixtures_down(tmp_path: Path) -> None:
    """A run stopped with SIGTERM (a CI time limit, ``timeout``) still tears its fixtures down,
    so a server a fixture started is stopped, not left running without its test; also after a
    test took the handler away."""
    (tmp_path / "test_inner.py").write_text(STOPPED)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "tests.support.hygiene_plugin"]
    inner = subprocess.Popen(
        [*argv, "-p", "no:cacheprovider", str(tmp_path / "test_inner.py")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    server = 0
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "ready").exists() and time.monotonic() < deadline:
            assert inner.poll() is None, inner.communicate()[0]
            time.sleep(0.05)
        server = int((tmp_path / "server.pid").read_text())
        inner.send_signal(signal.SIGTERM)
        out, _ = inner.communicate(timeout=60)
        assert inner.returncode == pytest.ExitCode.INTERRUPTED, out
        assert (tmp_path / "torn-down").read_text() == "yes", out
        assert not _alive(server)
    finally:
        if inner.poll() is None:
            inner.kill()
            inner.wait()
        if server and _alive(server):
            os.kill(server, signal.SIGKILL)
