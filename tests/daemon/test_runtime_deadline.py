"""A launch's ``max_runtime`` on the real node: the queue and a daemon run here, the daemon
renders the Pod with ``activeDeadlineSeconds``, the kubelet ends it, and the instance ends
``stopped`` with reason ``DeadlineExceeded`` long before the job would have ended itself."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nymph.localcluster import LocalCluster
from tests.launch.test_real_node import python_image
from tests.support.harness import DaemonProc, QueueProc, daemon_kubeconfig, setup_provider, wait_state

pytestmark = [pytest.mark.e2e, pytest.mark.realnode]

#: A job that would sleep a minute, and ends when told to (as PID 1 it would otherwise ignore the
#: kubelet's SIGTERM, and the kill would wait out the Pod's 30 s grace period).
SLEEPER = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))\n"
    "print('sleeping', flush=True)\ntime.sleep(60)\nprint('woke up')\n"
)


@pytest.fixture
def stack(real_kube: LocalCluster, real_namespace: str, tmp_path: Path) -> Iterator[QueueProc]:
    """A queue and one daemon on the host, the daemon serving ``real_namespace`` on the real node."""
    assert real_kube.real_node is not None
    queue = QueueProc(tmp_path / "queue.db")
    daemon: DaemonProc | None = None
    try:
        queue.tokens()
        queue.start()
        asyncio.run(setup_provider(queue, real_namespace, image=python_image(real_kube)))
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


async def test_a_launch_past_its_max_runtime_ends_deadline_exceeded(
    stack: QueueProc, real_kube: LocalCluster, real_namespace: str
) -> None:
    async with stack.client() as c:
        accepted = await c.launch(provider="local", mode="py", script=SLEEPER, fields={"max_runtime": "5s"})
    iid = str(accepted["instanceId"])
    await wait_state(stack, iid, {"running", "stopped"}, timeout=60)
    started = time.monotonic()
    inst = await wait_state(stack, iid, {"stopped"}, timeout=45)
    took = time.monotonic() - started
    assert inst["reason"] == "DeadlineExceeded", inst
    assert took < 40, f"the deadline took {took:.0f}s to end a 5s job"
    pod = real_kube.api("GET", f"/api/v1/namespaces/{real_namespace}/pods/{iid}")
    assert pod["spec"]["activeDeadlineSeconds"] == 5
    assert pod["status"]["phase"] == "Failed" and pod["status"]["reason"] == "DeadlineExceeded"
    assert [h["state"] for h in inst["history"]][-1] == "stopped"
