"""The console on the real node (kubelet, containerd, runc; the queue and a daemon as
processes): a launch from the browser's form goes queued -> running -> stopped while its page
follows it, its output appears on the page while it still runs, and its result downloads."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from nymph.localcluster import LocalCluster
from tests.daemon.test_logs import RealStack
from tests.launch.test_real_node import python_image
from tests.queue.console.browser import Shots, browser, shots
from tests.queue.console.test_browser import Watched, expect
from tests.support.harness import setup_provider

pytestmark = [pytest.mark.e2e, pytest.mark.realnode]
__all__ = ["browser", "shots"]

SCRIPT = """\
import os, sys, time
time.sleep(2)
for i in range(8):
    print("tick %d <b>bold?</b>" % i, flush=True)
    time.sleep(0.5)
os.makedirs("out", exist_ok=True)
with open("out/answer.txt", "w") as fh:
    fh.write("42\\n")
"""


@pytest.fixture
def real_stack(real_kube: LocalCluster, real_namespace: str, tmp_path: Path) -> Iterator[RealStack]:
    """The queue and a daemon on the real node, provider ``local`` with mode ``py``; set up in
    a thread of its own (the browser's driver holds this thread's event loop)."""
    s = RealStack(real_kube, real_namespace, tmp_path)
    try:
        s.queue.tokens()
        s.queue.start()
        image = python_image(real_kube)
        with ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, setup_provider(s.queue, real_namespace, image=image)).result(120)
        s.daemon()
        yield s
    finally:
        s.kill_all()


def _state(page: Any) -> str | None:
    try:
        return str(page.inner_text("#state", timeout=1000))
    except Exception:  # the page is reloading as the state changes
        return None


def test_a_launch_seen_from_queued_to_stopped(browser: Any, real_stack: RealStack, shots: Shots) -> None:
    """Launched from the form, the instance's page shows it running with its output arriving
    live, then stopped with exit code 0 and its result; its history holds queued, running and
    stopped in that order."""
    s = real_stack
    w = Watched(browser, s.queue.url)
    try:
        page = w.page
        w.sign_in(s.queue.user_token)
        page.goto("/console/ns/default/providers/local/")
        page.fill("#script", SCRIPT)
        page.click("form.launch button[type=submit]")
        page.wait_for_url(re.compile(r"/instances/lakeshore-[0-9a-f]{8}$"))
        seen = [_state(page)]
        expect(page.locator("#log")).to_contain_text("tick 1", timeout=120_000)
        seen.append(_state(page))
        assert seen[-1] == "running", seen  # the output appeared while it still ran
        shots.take(page, "realnode-running")
        deadline = time.monotonic() + 120
        while _state(page) != "stopped":
            assert time.monotonic() < deadline, seen
            page.wait_for_timeout(200)
        # The daemon uploads the results as the Pod ends, beside its last report: look again
        # until they are there.
        while page.locator("a[download]").count() == 0 or "tick 7" not in page.inner_text("#log"):
            assert time.monotonic() < deadline + 60, page.inner_text("main")
            page.wait_for_timeout(500)
            page.reload()
        cells = page.locator("#history tbody tr td:nth-child(2)").all_inner_texts()
        history = [c.strip() for c in cells]
        assert history[0] == "queued" and "running" in history and history[-1] == "stopped", history
        assert history.index("running") < len(history) - 1
        assert "tick 7 <b>bold?</b>" in page.inner_text("#log")
        with page.expect_download() as got:
            page.click("a[download]")
        assert Path(got.value.path()).read_bytes() == b"42\n"
        shots.take(page, "realnode-stopped")
        assert not w.dialogs and w.check_headers() > 5
    finally:
        w.close()
