"""An image that cannot be pulled, on the real node: the kubelet retries the pull for ever, the
daemon stops the launch after its mode's image-pull timeout (its Pod deleted, the instance
stopped / ImagePull saying why), and ``nymph launch --wait`` exits 125 with that reason instead
of waiting for ever; with ``--timeout`` it gives up first, exits 124 and says how to stop it."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nymph.localcluster import LocalCluster
from tests.launch.test_real_node import python_image
from tests.support.harness import DaemonProc, QueueProc, daemon_kubeconfig, nymph, setup_provider, wait_state
from tests.support.tally import TALLY

pytestmark = [pytest.mark.e2e, pytest.mark.realnode, pytest.mark.faults]

#: Nothing listens on port 1: the pull fails at once, with no network needed.
UNPULLABLE = "localhost:1/nope:latest"


@pytest.fixture
def stack(real_kube: LocalCluster, real_namespace: str, tmp_path: Path) -> Iterator[QueueProc]:
    """A queue and one daemon on the host, the daemon serving ``real_namespace`` on the real
    node; mode ``bad`` names an image nobody can pull and a 10 s image-pull timeout."""
    assert real_kube.real_node is not None
    queue = QueueProc(tmp_path / "queue.db")
    daemon: DaemonProc | None = None
    try:
        queue.tokens()
        queue.start()
        asyncio.run(setup_provider(queue, real_namespace, image=python_image(real_kube)))

        async def bad_mode() -> None:
            async with queue.client() as c:
                await c.create_mode(
                    name="bad", provider="local", fields={"image": UNPULLABLE, "image_pull_timeout": "10s"}
                )

        asyncio.run(bad_mode())
        daemon = DaemonProc(
            queue,
            daemon_kubeconfig(real_kube, real_namespace, tmp_path),
            real_namespace,
            tmp_path / "root",
            node=real_kube.real_node,
        ).start()
        yield queue
    finally:
        if daemon is not None:
            daemon.kill()
        queue.kill()


def _launch(queue: QueueProc, tmp_path: Path, *extra: str) -> tuple[int, str, str, float]:
    script = tmp_path / "job.py"
    script.write_text("print('never runs')\n")
    env = {"NYMPH_URL": queue.url, "NYMPH_TOKEN": queue.user_token}
    started = time.monotonic()
    out = nymph(
        "launch", "local", "--mode", "bad", "--script", str(script), "--wait", *extra, env=env, timeout=120
    )
    return out.returncode, out.stdout, out.stderr, time.monotonic() - started


def test_an_unpullable_image_ends_image_pull_and_wait_exits_125(
    stack: QueueProc, real_kube: LocalCluster, real_namespace: str, tmp_path: Path
) -> None:
    """``launch --wait`` returns 125 within ~30 s of a 10 s timeout, saying the image could not
    be pulled; the instance is stopped / ImagePull and its Pod is gone."""
    code, stdout, stderr, took = _launch(stack, tmp_path)
    TALLY.launches += 1
    TALLY.bad_inputs += 1
    iid = stdout.split()[0]
    assert code == 125, (code, stderr)
    assert took < 45, f"launch --wait took {took:.0f}s for a 10s image-pull timeout"
    assert "never ran: ImagePull" in stderr, stderr
    assert f"'{UNPULLABLE}' could not be pulled for 10s" in stderr, stderr
    inst = asyncio.run(wait_state(stack, iid, {"stopped"}, timeout=5))
    assert inst["reason"] == "ImagePull", inst
    assert "image_pull_secrets" in inst["message"]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pods = real_kube.api("GET", f"/api/v1/namespaces/{real_namespace}/pods")["items"]
        if iid not in {p["metadata"]["name"] for p in pods}:
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"the Pod of {iid} is still there")


def test_wait_timeout_gives_up_first_and_says_how_to_stop(stack: QueueProc, tmp_path: Path) -> None:
    """``--timeout 3s`` gives up before the image-pull timeout: exit 124, the launch still
    there, and the stop command to end it."""
    code, stdout, stderr, took = _launch(stack, tmp_path, "--timeout", "3s", "--quiet")
    TALLY.launches += 1
    iid = stdout.split()[0]
    assert code == 124, (code, stderr)
    assert took < 30
    assert "gave up waiting after 3s" in stderr, stderr
    assert f"nymph stop local {iid}" in stderr, stderr
    inst = asyncio.run(wait_state(stack, iid, {"stopped"}, timeout=60))
    assert inst["reason"] == "ImagePull", inst


def test_ctrl_c_says_the_launch_goes_on(stack: QueueProc, tmp_path: Path) -> None:
    """SIGINT to a waiting ``launch --wait``: exit 130, saying the launch goes on and how to stop it."""
    script = tmp_path / "job.py"
    script.write_text("print('never runs')\n")
    env = {**os.environ, "NYMPH_URL": stack.url, "NYMPH_TOKEN": stack.user_token}
    # Started as from a terminal, with SIGINT at its default: a suite run in the background by a
    # shell without job control has SIGINT ignored, and a child would inherit that.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = _popen_launch(script, env)
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)
    try:
        assert proc.stdout is not None
        iid = proc.stdout.readline().strip()
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    TALLY.launches += 1
    assert proc.returncode == 130, stderr
    assert f"{iid} was launched and goes on" in stderr and f"nymph stop local {iid}" in stderr, stderr


def _popen_launch(script: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nymph.cli",
            "launch",
            "local",
            "--mode",
            "bad",
            "--script",
            str(script),
            "--wait",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
