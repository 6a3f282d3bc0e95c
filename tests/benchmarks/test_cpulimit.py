"""The benchmarks' CPU limit holds a busy process to its share of a core, and leaves no cgroup
behind: neither its own at the end of the block, nor one a killed benchmark left."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import cpulimit
from benchmarks.scoreboard.procstat import cpu

BUSY = "while True: pass"


def _ours() -> list[str]:
    root, _ = cpulimit._root()
    return sorted(p.name for p in root.glob(f"{cpulimit.PREFIX}*"))


@pytest.fixture
def cgroups() -> None:
    with cpulimit.cpu_limits() as probe:
        if probe.root is None:
            pytest.skip(f"no CPU limit can be set here: {probe.reason}")


@pytest.mark.usefixtures("cgroups")
def test_a_busy_process_gets_its_limit_and_the_group_goes_at_the_end() -> None:
    before = _ours()
    busy = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        with cpulimit.cpu_limits() as held:
            assert held.limit(busy.pid, 0.2)
            assert len(_ours()) == len(before) + 1
            c0, t0 = cpu(busy.pid).own, time.monotonic()
            time.sleep(1.5)
            share = (cpu(busy.pid).own - c0) / (time.monotonic() - t0)
        assert share <= 0.3, f"a process held to 0.2 of a core used {share:.2f}"
        assert _ours() == before  # moved back and removed, the process still running
        assert busy.poll() is None
        assert cpulimit.PREFIX not in Path(f"/proc/{busy.pid}/cgroup").read_text()
    finally:
        busy.kill()
        busy.wait()


@pytest.mark.usefixtures("cgroups")
def test_a_group_left_by_a_killed_benchmark_is_removed_by_the_next() -> None:
    root, _ = cpulimit._root()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = root / f"{cpulimit.PREFIX}{dead.pid}-0"
    stale.mkdir()
    try:
        mine = root / f"{cpulimit.PREFIX}{os.getpid()}-keep"
        mine.mkdir()  # a live owner's group stays
        try:
            with cpulimit.cpu_limits():
                assert not stale.exists()
                assert mine.exists()
        finally:
            mine.rmdir()
    finally:
        if stale.exists():
            stale.rmdir()
