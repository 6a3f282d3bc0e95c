"""The fault suite's summary, as a plugin (listed in tests/conftest.py).

The fault suite is every test marked ``faults`` (crash matrix, disk faults, hostile peers, bad
input, secrets), wherever its component puts it. Each runs against the real kube-apiserver (kwok
nodes) and/or the real queue service (a subprocess speaking HTTP, state in a SQLite file). When a
session runs any of them, the totals they measured are written as one line to
``fault-summary.txt`` at the repository root when the session ends; a session without them
writes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.tally import SUMMARY, TALLY

_written: list[str] = []


def _runs_the_fault_suite(session: pytest.Session) -> bool:
    return any(item.get_closest_marker("faults") is not None for item in session.items)


@pytest.fixture(scope="session", autouse=True)
def fault_summary(request: pytest.FixtureRequest) -> Iterator[None]:
    if not _runs_the_fault_suite(request.session):
        yield
        return
    TALLY.reset()
    try:
        yield
    finally:
        _written.append(TALLY.write())


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _written:
        terminalreporter.section("fault suite")
        terminalreporter.write_line(f"{SUMMARY.name}: {_written[-1]}")
