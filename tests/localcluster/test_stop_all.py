"""Stopping a local cluster's processes: one that outlives its SIGKILL keeps none of the others
running, and is named."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from nymph.localcluster.procs import Proc, ProcessesSurvived, spawn, stop_all


class _HeldInKernel(subprocess.Popen[bytes]):
    """A real child whose waits time out while it is held, as one in uninterruptible sleep
    (a hung mount) outlives its SIGKILL; released, it is reaped as usual."""

    held = True

    def wait(self, timeout: float | None = None) -> int:
        if self.held:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return super().wait(timeout)


def test_a_process_that_outlives_its_sigkill_is_named_and_the_others_are_still_stopped(
    tmp_path: Path,
) -> None:
    """stop_all goes on to the other processes after one that does not exit, then names it (with
    its log) in ProcessesSurvived; before, the first timeout ended stop_all and left every
    process after it running."""
    first = spawn("first", ["sleep", "300"], logdir=tmp_path)
    last = spawn("last", ["sleep", "300"], logdir=tmp_path)
    log = tmp_path / "stuck.log"
    stuck = _HeldInKernel(["sleep", "300"], start_new_session=True)
    procs = [first, Proc(name="stuck", popen=stuck, log=log), last]
    try:
        with pytest.raises(ProcessesSurvived) as caught:
            stop_all(procs, grace=0.2)
        assert f"stuck (pid {stuck.pid}, log {log})" in str(caught.value)
        assert "first (pid" not in str(caught.value) and "last (pid" not in str(caught.value)
        assert first.popen.poll() is not None, "the process started before it was stopped"
        assert last.popen.poll() is not None
    finally:
        stuck.held = False
        stuck.kill()
        stuck.wait(10)
        for p in (first, last):
            p.popen.kill()
            p.popen.wait(10)


def test_processes_that_exit_raise_nothing(tmp_path: Path) -> None:
    """The usual stop: SIGTERM ends each, nothing is raised."""
    procs = [spawn(n, ["sleep", "300"], logdir=tmp_path) for n in ("a", "b")]
    stop_all(procs, grace=5.0)
    assert [p.popen.returncode for p in procs] == [-15, -15]
