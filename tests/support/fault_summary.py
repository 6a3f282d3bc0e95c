"""The fault suite: crash matrix, disk faults, hostile peers, bad input, secrets.

Every test here runs against the real kube-apiserver (kwok nodes) and/or the real queue service
(a subprocess speaking HTTP, state in a SQLite file). The totals every test measured are written
as one line to ``fault-summary.txt`` at the repository root when the session ends.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.faults.tally import SUMMARY, TALLY

_written: list[str] = []


@pytest.fixture(scope="session", autouse=True)
def fault_summary() -> Iterator[None]:
    TALLY.reset()
    try:
        yield
    finally:
        _written.append(TALLY.write())


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _written:
        terminalreporter.section("fault suite")
        terminalreporter.write_line(f"{SUMMARY.name}: {_written[-1]}")
