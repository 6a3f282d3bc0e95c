"""One daemon per workdir root: the second waits for the first, a killed holder frees the root."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

from nymph.daemon.daemon import run_locked
from nymph.daemon.rootlock import RootLock
from nymph.daemon.settings import DaemonSettings, WorkSettings


def test_a_second_lock_on_the_same_root_is_refused_until_the_first_is_released(tmp_path: Path) -> None:
    first, second = RootLock(tmp_path), RootLock(tmp_path)
    assert first.try_acquire()
    assert not second.try_acquire()
    first.release()
    assert second.try_acquire()
    assert (tmp_path / "daemon.lock").read_text() == f"{os.getpid()}\n"
    second.release()


async def test_acquire_waits_for_the_holder_and_then_takes_the_root(tmp_path: Path) -> None:
    holder, waiter = RootLock(tmp_path), RootLock(tmp_path)
    assert holder.try_acquire()
    got = asyncio.create_task(waiter.acquire(stopping=asyncio.Event(), poll=0.02))
    await asyncio.sleep(0.2)
    assert not got.done(), "the second daemon must wait while the first holds the root"
    holder.release()
    assert await asyncio.wait_for(got, 5) is True
    assert waiter.held
    waiter.release()


def test_a_killed_holder_frees_the_root(tmp_path: Path) -> None:
    code = (
        "import sys, time; from pathlib import Path; from nymph.daemon.rootlock import RootLock; "
        "assert RootLock(Path(sys.argv[1])).try_acquire(); print('held', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "held\n"
        assert not RootLock(tmp_path).try_acquire()
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        lock = RootLock(tmp_path)
        assert lock.try_acquire()
        lock.release()
    finally:
        proc.kill()
        proc.wait()


async def test_a_daemon_stopped_while_waiting_exits_0_and_writes_nothing(tmp_path: Path) -> None:
    holder = RootLock(tmp_path)
    assert holder.try_acquire()
    stopping = asyncio.Event()
    settings = DaemonSettings(work=WorkSettings(root=tmp_path))
    run = asyncio.create_task(run_locked(settings, stopping=stopping))
    await asyncio.sleep(0.3)
    assert not run.done()
    stopping.set()
    assert await asyncio.wait_for(run, 5) == 0
    assert sorted(os.listdir(tmp_path)) == ["daemon.lock"], "no audit, outbox or workdir"
    holder.release()


async def test_a_root_that_cannot_hold_the_lock_file_does_not_block_the_start(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.write_text("not a directory")
    assert await RootLock(root).acquire(stopping=asyncio.Event()) is True
