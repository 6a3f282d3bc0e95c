"""Shared fixtures. Real-cluster fixtures live in tests/kube_fixtures.py."""

pytest_plugins = ["tests.kube_fixtures", "tests.require_plugin", "tests.hygiene_plugin"]
