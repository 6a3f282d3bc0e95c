"""The background image builds of tests/support/image_builds.py: a failed build is reported with
the end of its log, and a stopped build leaves neither its processes nor its log behind."""

from __future__ import annotations

import os
import sys
import time

import pytest

from nymph.localcluster.images import ImageBuildError
from tests.support.image_builds import BackgroundBuild


def test_a_failed_build_is_reported_with_the_end_of_its_log() -> None:
    build = BackgroundBuild.start("no-such-image")
    try:
        with pytest.raises(ImageBuildError, match=r"(?s)exit 2.*no local image no-such-image"):
            build.result()
    finally:
        build.stop()


def test_a_stopped_build_leaves_no_process_and_no_log() -> None:
    script = "import subprocess, time; subprocess.Popen(['sleep', '60']); time.sleep(60)"
    build = BackgroundBuild.start("sleeper", argv=[sys.executable, "-c", script])
    assert not build.wait(0.3)
    build.stop()
    assert build.done() and build.proc.popen.returncode != 0
    assert not build.logdir.exists()
    deadline = time.monotonic() + 5  # the orphaned child exits on the group's SIGTERM
    while _group_alive(build.proc.popen.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _group_alive(build.proc.popen.pid), "a child of the build outlived it"


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
