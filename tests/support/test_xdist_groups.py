"""Under ``--dist loadgroup`` (``make test``), every test that needs the control plane, or is in
the fault suite, runs on one worker, in collection order, while the other tests are spread
over the workers beside them."""

from __future__ import annotations

from pathlib import Path

from tests.support.inner_pytest import run_inner

INNER = """
import os
import time
from pathlib import Path

import pytest

LOG = Path(os.environ["GROUP_LOG"])

def note(kind, name):
    with LOG.open("a") as f:
        f.write(f"{kind} {name} {os.environ.get('PYTEST_XDIST_WORKER', '-')}\\n")

@pytest.mark.e2e
@pytest.mark.parametrize("k", range(4))
def test_needs_the_control_plane(k):
    note("group", f"e2e{k}")
    time.sleep(0.3)

@pytest.mark.parametrize("k", range(12))
def test_plain(k):
    note("plain", f"p{k}")
    time.sleep(0.05)

@pytest.mark.faults
def test_in_the_fault_suite():
    note("group", "fault")
"""


def test_the_control_plane_tests_run_on_one_worker_in_order_beside_the_rest(tmp_path: Path) -> None:
    log = tmp_path / "ran.log"
    res = run_inner(
        tmp_path,
        INNER,
        "-p",
        "tests.support.xdist_groups",
        "-n",
        "2",
        "--dist",
        "loadgroup",
        env={"GROUP_LOG": str(log)},
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "17 passed" in res.stdout
    ran = [line.split() for line in log.read_text().splitlines()]
    group = [(name, worker) for kind, name, worker in ran if kind == "group"]
    assert [name for name, _ in group] == ["e2e0", "e2e1", "e2e2", "e2e3", "fault"]
    assert len({worker for _, worker in group}) == 1
    (group_worker,) = {worker for _, worker in group}
    plain_workers = {worker for kind, _, worker in ran if kind == "plain"}
    assert plain_workers - {group_worker}, "no plain test ran beside the group"
