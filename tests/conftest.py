"""The root of the test tree: the shared fixtures and plugins of tests/support, for every test.

Real-cluster fixtures live in tests/support/kube_fixtures.py, the queue service's in
tests/support/queue_fixtures.py; the fault suite's summary is tests/support/fault_summary.py.
"""

pytest_plugins = [
    "tests.support.kube_fixtures",
    "tests.support.image_builds",
    "tests.support.kuberay_fixtures",
    "tests.support.queue_fixtures",
    "tests.support.fault_summary",
    "tests.support.require_plugin",
    "tests.support.hygiene_plugin",
    "tests.support.helm",
]
