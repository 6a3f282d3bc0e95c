"""A daemon that stops (a DaemonSet rollout, a node drain): it hands back every lease it holds
once what it completed is sent, tasks of a claim it never saw the answer of included, and a
second signal ends it at once."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from nymph.localcluster import LocalCluster
from tests.support.fake_queue import FakeQueue
from tests.support.harness import DaemonProc, daemon_kubeconfig

pytestmark = pytest.mark.e2e


def _wait(cond: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def _daemon(fake: FakeQueue, kube: LocalCluster, namespace: str, tmp_path: Path) -> DaemonProc:
    kubeconfig = daemon_kubeconfig(kube, namespace, tmp_path)
    return DaemonProc(fake, kubeconfig, namespace, tmp_path / "root").start()  # type: ignore[arg-type]


def _release_all(fake: FakeQueue) -> list[dict[str, object]]:
    return [b for b in fake.bodies("release") if isinstance(b, dict) and b.get("all") is True]


def test_a_stopping_daemon_hands_back_every_lease_it_holds_at_the_end(
    kube: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    with FakeQueue() as fake:  # every claim is a long-poll that ends with no task
        d = _daemon(fake, kube, namespace, tmp_path)
        assert d.proc is not None
        _wait(lambda: fake.count("claim") >= 1, 60)
        d.proc.send_signal(signal.SIGTERM)
        assert d.proc.wait(timeout=60) == 0
        [body] = _release_all(fake)
        assert body["daemonId"] and "taskIds" not in body
        assert fake.seen[-1].route == "release", "handed back last, once nothing else was to send"


def test_a_second_signal_ends_a_stuck_shutdown_at_once(
    kube: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    with FakeQueue(hang=frozenset({"release"})) as fake:
        d = _daemon(fake, kube, namespace, tmp_path)
        assert d.proc is not None
        _wait(lambda: fake.count("claim") >= 1, 60)
        d.proc.send_signal(signal.SIGTERM)
        _wait(lambda: bool(_release_all(fake)), 30)  # stopping, and the queue does not answer
        d.proc.send_signal(signal.SIGTERM)
        assert d.proc.wait(timeout=10) == 128 + signal.SIGTERM
    log = (tmp_path / "daemon-root.log").read_text(errors="replace")
    assert "second SIGTERM: exiting now" in log
