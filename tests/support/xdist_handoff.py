"""What the test plugins hand between a pytest-xdist worker and the main process: a worker
puts a value under its plugin's key in ``workeroutput`` as its session ends, and the main
process reads it from the worker's node when that worker is down (``pytest_testnodedown``).
Outside xdist there is no worker and nothing is handed."""

from __future__ import annotations

from typing import Any

import pytest


def worker_output(config: pytest.Config) -> dict[str, Any] | None:
    """What this process hands the main process at its end, when it is a worker; else None."""
    return getattr(config, "workeroutput", None)


def worker_input(config: pytest.Config) -> dict[str, Any]:
    """What the main process gave this worker at its start (empty outside a worker)."""
    return getattr(config, "workerinput", None) or {}


def handed(node: Any, key: str) -> Any:
    """What the worker behind ``node`` handed under ``key`` (None when nothing)."""
    return (getattr(node, "workeroutput", None) or {}).get(key)
