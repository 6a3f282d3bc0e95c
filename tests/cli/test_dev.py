"""`nymph dev`, the main job, end to end on the embedded cluster's kwok node (the real node's run is
the first-hour walkthrough, tests/cli/test_first_hour.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.devstay import start_dev_stay
from tests.support.hygiene_plugin import track

pytestmark = pytest.mark.e2e


def _stay_on_kwok(tmp_path: Path) -> tuple[Path, subprocess.Popen[str], str]:
    """``nymph dev --stay`` on a kwok node, with no kube context to find: its state dir, the
    process and what it printed until it stays up."""
    state = tmp_path / "dev"
    proc, text = start_dev_stay(
        state,
        env={**os.environ, "KUBECONFIG": str(tmp_path / "none")},
        extra=["--node-kind", "kwok"],
        timeout=180,
    )
    return state, proc, text


def _nothing_left(state: Path) -> None:
    left = subprocess.run(["pgrep", "-f", str(state)], capture_output=True, text=True)
    assert left.stdout.strip() == "", f"processes left behind: {left.stdout}"


def test_nymph_dev_reaches_stopped_and_stays_until_interrupted(kube: object, tmp_path: Path) -> None:
    state, proc, text = _stay_on_kwok(tmp_path)
    assert "stopped (Completed)" in text, text
    assert "audit chain is intact" in text, text
    env_file = state / "user.env"
    assert oct(env_file.stat().st_mode & 0o777) == "0o600"
    # More launches work while it stays up.
    env = dict(os.environ)
    for line in env_file.read_text().splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = value
    (tmp_path / "job.py").write_text("print(2)\n")
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "nymph.cli",
            "launch",
            "dev",
            "--mode",
            "python",
            "--script",
            str(tmp_path / "job.py"),
            "--wait",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "lakeshore-" in out and "Completed" in out
    _nothing_left(state)


def _read_until(proc: subprocess.Popen[str], marker: str, seen: list[str], timeout: float) -> bool:
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            return False
        seen.append(line)
        if marker in line:
            return True
    return False


def test_ctrl_c_while_the_cluster_starts_stops_at_once_and_a_second_one_cannot_cut_the_stop_short(
    kube: object, tmp_path: Path
) -> None:
    """Ctrl-C during start-up interrupts it (exit 130) instead of being held until the demo has
    run, everything started so far is stopped, and a second Ctrl-C while stopping only says so."""
    state = tmp_path / "dev"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nymph.cli",
            "dev",
            "--embedded",
            "--node-kind",
            "kwok",
            "--state-dir",
            str(state),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "KUBECONFIG": str(tmp_path / "none")},
        start_new_session=True,
    )
    track(proc)
    seen: list[str] = []
    assert _read_until(proc, "starting kube-apiserver", seen, 120), "".join(seen)
    proc.send_signal(signal.SIGINT)
    assert _read_until(proc, "stopping the cluster", seen, 60), "".join(seen)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=90)
    text = "".join(seen) + err
    assert proc.returncode == 130, text
    assert "nymph: interrupted" in text
    assert "[3/7]" not in text, "nothing after the interrupted step ran"
    assert "still stopping what it started" in text, text
    _nothing_left(state)


def test_a_daemon_that_dies_during_stay_is_named_and_ends_the_stay_with_exit_1(
    kube: object, tmp_path: Path
) -> None:
    state, proc, text = _stay_on_kwok(tmp_path)
    assert "Ctrl-C stops everything" in text, text
    found = subprocess.run(
        ["pgrep", "-f", f"daemon --queue .*--workdir-root {state}/root"], capture_output=True, text=True
    )
    pids = found.stdout.split()
    assert len(pids) == 1, found
    os.kill(int(pids[0]), signal.SIGKILL)
    _out, err = proc.communicate(timeout=90)
    assert proc.returncode == 1, err
    assert f"the daemon exited with code -9; see {state / 'daemon.log'}" in err
    _nothing_left(state)
