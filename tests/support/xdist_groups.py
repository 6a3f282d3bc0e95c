"""Which tests share one pytest-xdist worker when ``make test`` runs on every core.

Every test that needs the local control plane (``e2e``) or belongs to the fault suite
(``faults``) is one unit of work, ``control-plane``: it goes to one worker, which runs those
tests one after another in their usual order, sharing one set of session fixtures (one kwok
control plane, one real node, one KubeRay operator) as a run without xdist does. Their
processes, network devices and CPU-heavy phases never overlap each other, and the fault
suite's tally stays whole. Every other test (no control plane: pure code, the queue service on
SQLite or PostgreSQL, the daemon against a local queue) is spread over the workers, so it runs
beside that unit instead of before or after it.

``--dist loadgroup`` turns this on (without xdist, ``pytest`` alone, nothing changes). The
``xdist_group`` marker cannot carry it: pytest-xdist puts a test's group into its node id, which
pytest 9.2 no longer lets a plugin change. So each worker writes the ids of the tests it
collected for the group to a file the main process named, and the main process's scheduler (a
pytest-xdist ``LoadScopeScheduling`` whose scope of those ids is the group) reads them once
every worker's collection is in, before it hands out any work.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.xdist_handoff import worker_input

GROUP = "control-plane"
#: The key, in what the main process gives each worker, of the file it writes the group's ids to.
IDS_FILE = "nymph_group_ids"

_dirs: list[Path] = []


def in_group(item: pytest.Item) -> bool:
    return item.get_closest_marker("e2e") is not None or item.get_closest_marker("faults") is not None


def _ids_dir() -> Path:
    if not _dirs:
        _dirs.append(Path(tempfile.mkdtemp(prefix="nymph-xdist-")))
    return _dirs[0]


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> Iterator[None]:
    """On a worker, after every other plugin chose the items: the group's ids, to the file."""
    result = yield
    where = worker_input(config).get(IDS_FILE)
    if where is not None:
        ids = [item.nodeid for item in items if in_group(item)]
        Path(where).write_text("".join(f"{nodeid}\n" for nodeid in ids))
    return result


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    node.workerinput[IDS_FILE] = str(_ids_dir() / f"ids.{node.gateway.id}")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getoption("dist", None) != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ControlPlaneGroup(LoadScopeScheduling):  # type: ignore[misc]
        """One unit of work for the group's tests, one per test for the rest."""

        group: frozenset[str] = frozenset()

        def schedule(self) -> None:
            ids: set[str] = set()
            for path in _ids_dir().glob("ids.*"):
                ids.update(line for line in path.read_text().splitlines() if line)
            self.group = frozenset(ids)
            super().schedule()

        def _split_scope(self, nodeid: str) -> str:
            return GROUP if nodeid in self.group else nodeid

    return ControlPlaneGroup(config, log)


def pytest_unconfigure(config: pytest.Config) -> None:
    while _dirs:
        shutil.rmtree(_dirs.pop(), ignore_errors=True)
