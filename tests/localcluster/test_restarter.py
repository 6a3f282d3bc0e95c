"""A child that keeps no state (kwok) is started again when it dies, a bounded number of times,
and never once it is being stopped."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from nymph.localcluster import LocalCluster
from nymph.localcluster.procs import Proc, Restarter, stop_all
from tests.localcluster.test_control_plane import bare_pod


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_a_killed_child_is_started_again_in_its_place_and_stop_leaves_none(tmp_path: Path) -> None:
    procs: list[Proc] = []
    said: list[str] = []
    released: list[int] = []
    r = Restarter(
        "sleeper",
        ["sleep", "300"],
        logdir=tmp_path,
        procs=procs,
        backoff=0.01,
        say=said.append,
        before_restart=lambda: released.append(r.proc.popen.pid),
    )
    first = r.proc.popen.pid
    try:
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: r.proc.popen.pid != first and r.proc.popen.poll() is None)
        assert [p.popen.pid for p in procs] == [r.proc.popen.pid]
        assert r.restarts == 1 and r.gave_up is None
        assert released == [first], "the hook runs once, before the new child starts"
        assert said == ["sleeper exited with code -9; starting it again (1 of 5)"]
        assert "starting it again (1 of 5)" in (tmp_path / "sleeper.log").read_text()
    finally:
        r.stop()
        second = r.proc.popen.pid
        stop_all(procs)
    assert gone(first) and gone(second)
    assert r.restarts == 1, "a child stopped by stop_all after stop() is not started again"
    assert r.proc.popen.pid == second


def test_a_child_that_keeps_dying_is_given_up_with_its_exit_code(tmp_path: Path) -> None:
    procs: list[Proc] = []

    def broken_hook() -> None:
        raise RuntimeError("the API server is away")

    r = Restarter(
        "crasher",
        ["sh", "-c", "exit 3"],
        logdir=tmp_path,
        procs=procs,
        limit=2,
        backoff=0.01,
        before_restart=broken_hook,
    )
    try:
        wait_for(lambda: r.gave_up is not None)
    finally:
        r.stop()
        stop_all(procs)
    assert r.gave_up == 3 and r.restarts == 2
    assert len(procs) == 1, "each new child takes the place of the one that died"
    log = (tmp_path / "crasher.log").read_text()
    assert "starting it again (2 of 2)" in log and "not started again (2 restarts used)" in log
    assert log.count("before starting crasher again: the API server is away") == 2, (
        "a failing hook stops nothing"
    )


def test_stop_while_the_hook_hangs_returns_and_no_child_starts_after_it(tmp_path: Path) -> None:
    procs: list[Proc] = []
    in_hook, release = threading.Event(), threading.Event()

    def hanging_hook() -> None:  # an API server that does not answer
        in_hook.set()
        release.wait(10)

    r = Restarter(
        "sleeper", ["sleep", "300"], logdir=tmp_path, procs=procs, backoff=0.01, before_restart=hanging_hook
    )
    first = r.proc.popen.pid
    try:
        os.kill(first, signal.SIGKILL)
        assert in_hook.wait(10)
        t0 = time.monotonic()
        r.stop()
        assert time.monotonic() - t0 < 5, "stop() does not wait for a hook that hangs"
        release.set()
        r._thread.join(5)
        assert not r._thread.is_alive()
        assert [p.popen.pid for p in procs] == [first], "no child starts once stop() has returned"
    finally:
        release.set()
        r.stop()
        stop_all(procs)


def test_a_child_started_again_outlives_stop_until_stop_all_ends_it(tmp_path: Path) -> None:
    """The kernel kills a child when the thread that started it ends (PR_SET_PDEATHSIG): the
    restarter's thread must outlive the child it started, which stop_all then ends gracefully."""
    procs: list[Proc] = []
    r = Restarter("sleeper", ["sleep", "300"], logdir=tmp_path, procs=procs, backoff=0.01)
    first = r.proc.popen.pid
    try:
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: r.proc.popen.pid != first and r.proc.popen.poll() is None)
        r.stop()
        time.sleep(1.0)  # the thread polls every 0.2 s
        assert r.proc.popen.poll() is None, "the running child stays after stop(), for stop_all"
    finally:
        r.stop()
        stop_all(procs)
    assert r.proc.popen.returncode == -signal.SIGTERM, "stop_all ended it, not the kernel's SIGKILL"
    r._thread.join(5)
    assert not r._thread.is_alive()


def test_a_child_that_cannot_be_started_again_is_given_up_and_said(tmp_path: Path) -> None:
    procs: list[Proc] = []
    script = tmp_path / "vanishing.sh"
    script.write_text('#!/bin/sh\nrm -f "$0"\nexit 3\n')  # its binary is gone when it dies
    script.chmod(0o755)
    said: list[str] = []
    r = Restarter("vanishing", [str(script)], logdir=tmp_path, procs=procs, backoff=0.01, say=said.append)
    try:
        wait_for(lambda: r.gave_up is not None)
        r._thread.join(5)
    finally:
        r.stop()
        stop_all(procs)
    assert r.gave_up == 3, "the exit code of the child that died"
    assert not r._thread.is_alive()
    assert any("vanishing could not be started again" in line for line in said)
    assert "could not be started again" in (tmp_path / "vanishing.log").read_text()
    assert not r.replaced(r.proc), "a child given up is a death to report"


def test_every_child_the_restarter_replaced_is_not_a_death_to_report(tmp_path: Path) -> None:
    """A reader that took the dead child from procs just before the restart put the new one in
    its place still finds it accounted for (asking whether it is the running one would race)."""
    procs: list[Proc] = []
    r = Restarter("sleeper", ["sleep", "300"], logdir=tmp_path, procs=procs, backoff=0.01)
    old = r.proc
    stranger = Proc(name="other", popen=old.popen, log=old.log)
    try:
        os.kill(old.popen.pid, signal.SIGKILL)
        wait_for(lambda: r.proc is not old and r.proc.popen.poll() is None)
        assert old.popen.poll() is not None
        assert r.replaced(old) and r.replaced(r.proc)
        assert not r.replaced(stranger), "only the restarter's own children"
    finally:
        r.stop()
        stop_all(procs)


@pytest.mark.e2e
def test_a_cluster_whose_kwok_dies_starts_it_again_and_its_pods_still_run(tmp_path: Path) -> None:
    small = LocalCluster(tmp_path / "c3", assets=None, controller_manager=True)
    small.start()
    pids: list[int] = []
    try:
        assert small.kwok is not None
        first = small.kwok.proc.popen.pid
        pids = [p.popen.pid for p in small.procs]
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: small.kwok is not None and small.kwok.proc.popen.pid != first)
        pids.append(small.kwok.proc.popen.pid)
        assert small.kwok.proc in small.procs
        small._check_alive()  # a kwok started again is not a dead control plane
        small.api("POST", "/api/v1/namespaces/default/pods", bare_pod("after", {"sim.nymph.io/run": "1s"}))

        def phase() -> str:
            pod = small.api("GET", "/api/v1/namespaces/default/pods/after")
            return str(pod.get("status", {}).get("phase"))

        wait_for(lambda: phase() == "Succeeded", timeout=30)
    finally:
        small.stop()
    for pid in pids:
        assert gone(pid)
