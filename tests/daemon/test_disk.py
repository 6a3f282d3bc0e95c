"""The workdir root unusable during launches, then usable again: recovery without a restart.

No mounts are allowed in the tests, so the two faults are made with what a root process can do
to a running daemon, and they are approximations, said plainly:

* "full": the daemon's soft RLIMIT_FSIZE is set to 0 with prlimit(2) while it runs (its kubectl
  children inherit it), so every write that would grow a regular file fails with EFBIG, as
  writes fail with ENOSPC on a full disk. Directories can still be made (a full ext4 would refuse
  those too). The daemon's stdout goes to a pipe here, not a file, so its logging is unaffected.
* "read-only": ``chattr -R +i`` on the root, so nothing under it can be created, written,
  renamed or removed (EPERM where a read-only mount gives EROFS).

While the root is unusable, launches are queued; ``/readyz`` must turn 503. When it is usable
again, with the same daemon process, every launch must complete, ``/readyz`` must be 200 and the
audit log must verify.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from nymph.localcluster import LocalCluster
from tests.support.harness import NODE, DaemonProc, launch, wait_http, wait_state
from tests.support.hygiene_plugin import track
from tests.support.stack import FaultStack, running_stack
from tests.support.tally import TALLY

pytestmark = [pytest.mark.faults, pytest.mark.e2e, pytest.mark.slow]


class PipedDaemon(DaemonProc):
    """The harness's daemon, with stdout/stderr through a pipe copied to the log by a thread."""

    def start(self) -> PipedDaemon:
        log = self.root.parent / f"daemon-{self.root.name}.log"
        args = [
            sys.executable, "-m", "nymph.cli", "--log-format", "json", "daemon",
            "--queue", self.queue.url, "--node", NODE, "--namespace", self.namespace,
            "--kubeconfig", str(self.kubeconfig), "--workdir-root", str(self.root),
            "--listen", f"127.0.0.1:{self.port}", "--poll-wait", "5", "--lease-seconds", "6", *self.extra,
        ]  # fmt: skip
        import os

        self.proc = track(
            subprocess.Popen(
                args,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env={**os.environ, "NYMPH_TOKEN": self.queue.daemon_token},
                start_new_session=True,
            )
        )
        out = self.proc.stdout
        assert out is not None

        def copy() -> None:
            with log.open("ab") as fh:
                for line in out:
                    fh.write(line)
                    fh.flush()

        threading.Thread(target=copy, name="daemon-log", daemon=True).start()
        wait_http(f"http://127.0.0.1:{self.port}/healthz")
        return self

    def readyz(self) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=3) as r:
                return int(r.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except OSError:
            return 0


@pytest.fixture
def stack(kube: LocalCluster, namespace: str, tmp_path: Path) -> Iterator[FaultStack]:
    for s in running_stack(kube, namespace, tmp_path, extra=("--reap-after", "3600")):
        s.daemon.kill()  # replaced by the piped daemon on the same root
        d = PipedDaemon(s.queue, s.daemon.kubeconfig, namespace, s.daemon.root, extra=s.extra)
        s.daemon = d.start()
        yield s


@contextlib.contextmanager
def unusable(how: str, pid: int, root: Path) -> Iterator[None]:
    if how == "full":
        # Only the soft limit: raising it back needs no privilege (the hard one stays).
        old = resource.prlimit(pid, resource.RLIMIT_FSIZE)
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (0, old[1]))
        try:
            yield
        finally:
            with contextlib.suppress(ProcessLookupError):
                resource.prlimit(pid, resource.RLIMIT_FSIZE, old)
    else:
        chattr = shutil.which("chattr")
        if chattr is None:
            pytest.fail("chattr is needed for the read-only root fault", pytrace=False)
        subprocess.run([chattr, "-R", "+i", str(root)], check=True)
        try:
            yield
        finally:
            subprocess.run([chattr, "-R", "-i", str(root)], check=False)


@pytest.mark.parametrize("how", ["full", "read-only"])
async def test_root_unusable_then_usable_recovers_without_restart(stack: FaultStack, how: str) -> None:
    d = stack.daemon
    assert isinstance(d, PipedDaemon) and d.proc is not None
    before = [await launch(stack.queue, tags={"sim.nymph.io/run": "1s"}) for _ in range(2)]
    for iid in before:
        await wait_state(stack.queue, iid, {"stopped"})
    pid = d.proc.pid
    problems: list[str] = []
    with unusable(how, pid, stack.root):
        during = [await launch(stack.queue, tags={"sim.nymph.io/run": "1s"}) for _ in range(4)]
        TALLY.launches += 4
        deadline = time.monotonic() + 20
        ready = d.readyz()
        while ready != 503 and time.monotonic() < deadline:
            await asyncio.sleep(0.3)
            ready = d.readyz()
        if ready != 503:
            problems.append(f"/readyz stayed {ready} while the root was {how}")
        if d.proc.poll() is not None:
            problems.append(f"the daemon exited while the root was {how}: {d.proc.returncode}")
    assert d.proc.poll() is None, problems
    after = [await launch(stack.queue, tags={"sim.nymph.io/run": "1s"}) for _ in range(2)]
    TALLY.launches += 4
    deadline = time.monotonic() + 60  # one deadline for all: a stuck launch costs it once
    for iid in during + after:
        try:
            inst = await wait_state(
                stack.queue, iid, {"stopped"}, timeout=max(1.0, deadline - time.monotonic())
            )
            if inst["reason"] != "Completed":
                problems.append(f"{iid}: ended {inst['reason']}: {inst['message']!r}")
        except AssertionError as exc:
            problems.append(str(exc)[:300])
            TALLY.lost += 1
    assert d.proc.pid == pid and d.proc.poll() is None, "recovered only by a restart"
    deadline = time.monotonic() + 20
    while d.readyz() != 200 and time.monotonic() < deadline:  # noqa: ASYNC110 - polls state outside this process
        await asyncio.sleep(0.3)
    if d.readyz() != 200:
        problems.append("/readyz did not return to 200")
    verify = stack.audit_verify()
    if verify.returncode != 0:
        problems.append(f"audit verify failed: {verify.stderr.strip()[-500:]}")
    assert not problems, problems
