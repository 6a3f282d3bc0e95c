"""Under NYMPH_E2E=require (CI), a skipped test fails the run.

Every fixture that can skip for a missing prerequisite (control-plane binaries, KubeRay CRDs,
a Ray head) already fails instead under ``require``; this hook is the guard that no other skip
slips through silently: the run ends non-zero and names each skipped test.
"""

from __future__ import annotations

import os

import pytest

_skipped: list[str] = []


def _required() -> bool:
    return os.environ.get("NYMPH_E2E", "").strip().lower() == "require"


def _record(report: pytest.TestReport | pytest.CollectReport) -> None:
    if _required() and report.skipped:
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _skipped.append(f"{report.nodeid}: {reason}")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _record(report)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    """A whole module skipped while it is collected (``pytest.skip(allow_module_level=True)``,
    an ``importorskip`` at the top): it has no test report of its own."""
    _record(report)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _required() and _skipped:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _required() and _skipped:
        terminalreporter.section("NYMPH_E2E=require: skipped tests are failures", red=True)
        for line in _skipped:
            terminalreporter.write_line(line)
