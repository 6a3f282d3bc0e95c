"""The root of the test tree: the shared fixtures and plugins of tests/support, for every test.

Real-cluster fixtures live in tests/support/kube_fixtures.py, the queue service's in
tests/support/queue_fixtures.py; the fault suite's summary is tests/support/fault_summary.py.
"""

import gc
from collections.abc import Iterator

import pytest

pytest_plugins = [
    "tests.support.kube_fixtures",
    "tests.support.image_builds",
    "tests.support.kuberay_fixtures",
    "tests.support.queue_fixtures",
    "tests.support.fault_summary",
    "tests.support.require_plugin",
    "tests.support.hygiene_plugin",
    "tests.support.helm",
    "tests.support.xdist_groups",
]


@pytest.fixture
def gc_restored() -> Iterator[None]:
    """For a test that runs :func:`nymph.eventloop.run` in the test process, which tunes that
    process's garbage collector: the collector is set back as it was."""
    threshold = gc.get_threshold()
    yield
    gc.set_threshold(*threshold)
    gc.unfreeze()
