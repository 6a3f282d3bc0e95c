"""The fault suite's summary line reaches the run's report also when the tests run on
pytest-xdist workers: the worker that ran them hands its tally to the main process."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.inner_pytest import run_inner
from tests.support.tally import SUMMARY

INNER = """
import pytest
from tests.support.tally import TALLY

@pytest.mark.faults
@pytest.mark.parametrize("k", range(3))
def test_tries_bad_input(k):
    TALLY.bad_inputs += 1

def test_plain():
    assert True
"""


@pytest.mark.parametrize("workers", [(), ("-n", "2", "--dist", "loadgroup")], ids=["one-process", "xdist"])
def test_the_summary_is_printed_by_the_main_process(tmp_path: Path, workers: tuple[str, ...]) -> None:
    kept = SUMMARY.read_bytes() if SUMMARY.exists() else None  # the outer run's, if any
    try:
        res = run_inner(
            tmp_path, INNER, "-p", "tests.support.fault_summary", "-p", "tests.support.xdist_groups", *workers
        )
    finally:
        if kept is None:
            SUMMARY.unlink(missing_ok=True)
        else:
            SUMMARY.write_bytes(kept)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "4 passed" in res.stdout
    section = res.stdout.split("fault suite", 1)[-1]
    assert "fault suite" in res.stdout and "bad inputs tried 3" in section, res.stdout
