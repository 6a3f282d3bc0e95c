"""The fault suite's summary, as a plugin (listed in tests/conftest.py).

The fault suite is every test marked ``faults`` (crash matrix, disk faults, hostile peers, bad
input, secrets, a queue replica killed), wherever its component puts it. Each runs against the real kube-apiserver (kwok
nodes) and/or the real queue service (a subprocess speaking HTTP, state in a SQLite file, or in
PostgreSQL for the crash matrix under ``NYMPH_FAULT_BACKEND`` and the replica tests). When a
session runs any of them, the totals they measured are written as one line to
``fault-summary.txt`` at the repository root when the session ends, followed by a line per
figure a test added (the crash matrix on each backend, the replica kill); a session without them
writes nothing. ``make test`` runs every fault test on one pytest-xdist worker (their group, see
tests/support/xdist_groups.py), so one worker's tally is the whole suite's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.tally import SUMMARY, TALLY
from tests.support.xdist_handoff import handed, worker_output

_written: list[list[str]] = []
_started: list[str] = []


def _in_the_fault_suite(item: pytest.Item) -> bool:
    return item.get_closest_marker("faults") is not None


def pytest_runtest_setup(item: pytest.Item) -> None:
    if _in_the_fault_suite(item):
        _started.append(item.nodeid)


@pytest.fixture(scope="session", autouse=True)
def fault_summary(request: pytest.FixtureRequest) -> Iterator[None]:
    """Set up before any fixture of the first test (so before the fault tests' own fixtures
    count anything); writes the line at the end if a fault test was started."""
    if not any(_in_the_fault_suite(item) for item in request.session.items):
        yield
        return
    TALLY.reset()
    try:
        yield
    finally:
        if _started:
            _written.append(TALLY.write())


#: The key of a worker's summary in what it hands the main process (pytest-xdist's workeroutput).
WORKER_SUMMARY = "nymph_fault_summary"


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """After the session fixtures' teardown wrote the summary: a pytest-xdist worker hands it
    to the main process, which prints it."""
    out = worker_output(session.config)
    if out is not None and _written:
        out[WORKER_SUMMARY] = _written[-1]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    lines = handed(node, WORKER_SUMMARY)
    if lines:
        _written.append([str(line) for line in lines])


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _written:
        terminalreporter.section("fault suite")
        total, *figures = _written[-1]
        terminalreporter.write_line(f"{SUMMARY.name}: {total}")
        for line in figures:
            terminalreporter.write_line(f"  {line}")
