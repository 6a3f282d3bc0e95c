"""``nymph dev --embedded --stay`` started by a test: tracked (killed with everything it started
when the test ends, pass or fail) and read up to the line that says it stays up."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.support.hygiene_plugin import track

READY = "Ctrl-C stops everything"


def start_dev_stay(
    state: Path, *, env: Mapping[str, str], extra: Sequence[str] = (), timeout: float = 240
) -> tuple[subprocess.Popen[str], str]:
    """The running ``nymph dev`` and what it printed on stderr until it stays up (or ended)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "nymph.cli", "dev", "--embedded", *extra, "--stay", "--state-dir", str(state)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(env),
        start_new_session=True,
    )
    track(proc)
    assert proc.stderr is not None
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        if READY in line:
            break
    return proc, "".join(seen)
