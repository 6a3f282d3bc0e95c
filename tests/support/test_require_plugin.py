"""Under NYMPH_E2E=require a skipped test fails the run, also on pytest-xdist workers (the main
process sees every worker's reports); elsewhere a skip is a skip."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.inner_pytest import run_inner

SKIPS = "import pytest\n\ndef test_a():\n    pytest.skip('no thing')\n\ndef test_b():\n    pass\n"


def run(tmp_path: Path, policy: str, *extra: str, source: str = SKIPS) -> subprocess.CompletedProcess[str]:
    return run_inner(
        tmp_path, source, "-p", "tests.support.require_plugin", *extra, env={"NYMPH_E2E": policy}
    )


@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["one-process", "xdist-workers"])
def test_a_skip_fails_the_run_under_require(tmp_path: Path, workers: tuple[str, ...]) -> None:
    res = run(tmp_path, "require", *workers)
    assert res.returncode == 1, res.stdout
    assert "skipped tests are failures" in res.stdout and "test_a" in res.stdout


MODULE_SKIP = (
    "import pytest\n\npytest.skip('no module', allow_module_level=True)\n\ndef test_c():\n    pass\n"
)


@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["one-process", "xdist-workers"])
def test_a_module_skipped_while_collected_fails_the_run_under_require(
    tmp_path: Path, workers: tuple[str, ...]
) -> None:
    res = run(tmp_path, "require", *workers, source=MODULE_SKIP)
    assert res.returncode == 1, res.stdout
    assert "skipped tests are failures" in res.stdout and "no module" in res.stdout


def test_a_skip_is_only_a_skip_elsewhere(tmp_path: Path) -> None:
    res = run(tmp_path, "auto")
    assert res.returncode == 0, res.stdout
