"""A local cluster's caller can stop its start between steps (``checkpoint``) and hear first
thing when it stops (``on_stop``): how ``nymph dev`` makes a Ctrl-C take effect."""

from __future__ import annotations

from pathlib import Path

import pytest

from nymph.localcluster import LocalCluster


class Interrupted(Exception):
    pass


def _interrupt() -> None:
    raise Interrupted


def test_a_checkpoint_that_raises_starts_no_process(tmp_path: Path) -> None:
    """The checkpoint runs before a control-plane process starts: raising there starts none."""
    cluster = LocalCluster(tmp_path, checkpoint=_interrupt)
    with pytest.raises(Interrupted):
        cluster._spawn("sleeper", ["sleep", "300"])
    assert cluster.procs == []
    assert not (tmp_path / "sleeper.log").exists()


def test_the_start_s_waits_run_the_checkpoint(tmp_path: Path) -> None:
    """Each turn of a wait (for the API server, the nodes, the service account) runs it, so a
    long wait is cut short too."""
    cluster = LocalCluster(tmp_path, checkpoint=_interrupt)
    with pytest.raises(Interrupted):
        cluster._check_alive()


def test_stop_calls_on_stop_before_anything_else(tmp_path: Path) -> None:
    """on_stop runs first thing in stop(), before the processes are stopped."""
    calls: list[str] = []
    cluster = LocalCluster(tmp_path, on_stop=lambda: calls.append("on_stop"), progress=calls.append)
    cluster._spawn("sleeper", ["sleep", "300"])
    proc = cluster.procs[0].popen
    cluster.stop()
    assert calls[:2] == ["on_stop", "stopping the cluster"]
    assert proc.returncode is not None and cluster.procs == []
