"""Run a test file of a test's own in a pytest of its own (a subprocess, the repository on its
path, no cache), with the plugins under test; what the tests of the test plugins use."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_inner(
    tmp_path: Path, body: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``body`` as ``test_inner.py`` in ``tmp_path``, run there with ``args`` (plugins with
    ``-p``, xdist's ``-n``...); the finished process, its output captured."""
    (tmp_path / "test_inner.py").write_text(body)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            *args,
            str(tmp_path / "test_inner.py"),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        cwd=tmp_path,
        timeout=120,
    )
