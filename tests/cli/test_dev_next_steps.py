"""The commands ``nymph dev --stay`` prints for another shell run this nymph even when its
virtualenv's ``bin`` is not on PATH."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.kube_fixtures import _skip_or_fail

PRINT = "from nymph.cli.devenv import nymph_command; print(nymph_command())"


def _printed(path: str) -> str:
    env = {**os.environ, "PATH": path}
    done = subprocess.run(
        [sys.executable, "-c", PRINT], capture_output=True, text=True, timeout=60, check=True, env=env
    )
    return done.stdout.strip()


def test_without_the_venv_on_path_the_printed_command_is_a_full_path_that_runs() -> None:
    bare = "/usr/bin:/bin"
    command = _printed(bare)
    assert command != "nymph"
    done = subprocess.run(
        ["/bin/sh", "-c", f"{command} --version"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PATH": bare},
    )
    assert done.returncode == 0 and done.stdout.startswith("nymph "), (command, done.stderr)


def test_with_this_nymph_on_path_the_printed_command_is_its_name() -> None:
    bindir = Path(sys.executable).parent
    if not (bindir / "nymph").is_file():
        _skip_or_fail("not an install with a console script beside the interpreter: run make install")
    assert _printed(f"{bindir}:/usr/bin:/bin") == "nymph"
