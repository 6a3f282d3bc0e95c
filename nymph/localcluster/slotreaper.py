"""The reaper: sweeps a real node's slot when the process that started it dies.

kubelet and containerd die with their launcher (``PR_SET_PDEATHSIG``), but the runc shims are
daemons by design and keep their containers running. The reaper is a small process in its own
session whose stdin is a pipe only the launcher holds: when the launcher exits, however it died,
the pipe closes, and if the slot is still recorded for a dead owner the reaper sweeps it (see
:mod:`nymph.localcluster.host`). After a normal stop the slot is already free and it just exits.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from nymph.localcluster import host
from nymph.localcluster.nodeconfig import NodeLayout


def reap_when_owner_dies(slot: int, root: Path) -> None:
    """Block until stdin closes (the launcher exited, however it died); if the slot is still
    recorded for a dead owner, sweep it and free it (the last node restores the sysctls)."""
    with contextlib.suppress(OSError):
        while os.read(0, 4096):
            pass
    deadline = time.monotonic() + 10  # the pipe closes while the owner is still exiting
    while time.monotonic() < deadline:
        owner = host.records(root).get(slot)
        if owner is None or not owner.alive():
            break
        time.sleep(0.1)
    with host.locked(root):
        owner = host.records(root).get(slot)
        if owner is None or owner.alive():
            return
        host.sweep(NodeLayout(slot=slot, state_dir=root / str(slot)))
        (root / f"{slot}.json").unlink(missing_ok=True)
        if not any(o.alive() for o in host.records(root).values()):
            host.restore_sysctls(root / "sysctls.json")
            host.remove_created_dirs(root / "host-dirs.json")


def start_reaper(layout: NodeLayout, *, root: Path | None = None) -> subprocess.Popen[bytes]:
    """A watcher in its own session that outlives a killed launcher just long enough to sweep
    its slot: the runc shims and their containers do not die with kubelet and containerd.
    Its stdin is a pipe only this process holds; closing it (or dying) wakes it."""
    root = root or host.state_root()
    return subprocess.Popen(
        [sys.executable, "-m", "nymph.localcluster.slotreaper", str(layout.slot), str(root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


if __name__ == "__main__":  # pragma: no cover - the reaper process
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    reap_when_owner_dies(int(sys.argv[1]), Path(sys.argv[2]))
