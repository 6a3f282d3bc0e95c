"""The benchmarks' process readings from /proc."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmarks.scoreboard.procstat import context_switches


def test_context_switches_count_every_live_thread_of_a_process_and_nothing_for_one_gone() -> None:
    """A thread's sleeps are switches of its process while the thread lives: the count holds
    the main thread's and a helper's that slept 20 times (read before it ends: an ended
    thread's count goes with it); a process that has ended reads 0, not an error."""
    slept = threading.Event()
    release = threading.Event()

    def own(tid: int | None) -> int:  # one thread's count, as /proc/PID/task/TID/status has it
        text = Path(f"/proc/{os.getpid()}/task/{tid}/status").read_text()
        return sum(int(ln.split(":", 1)[1]) for ln in text.splitlines() if "ctxt_switches" in ln)

    def nap() -> None:
        for _ in range(20):
            time.sleep(0.001)
        slept.set()
        release.wait(10)

    t = threading.Thread(target=nap, name="procstat-test-nap")
    t.start()
    try:
        assert slept.wait(10)
        # Both threads live until after the total is read and counts only grow, so the total
        # holds both (another thread of this process ending meanwhile only takes its own away).
        main, helper = own(threading.main_thread().native_id), own(t.native_id)
        assert helper >= 20
        assert context_switches(os.getpid()) >= main + helper
    finally:
        release.set()
        t.join(10)

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert context_switches(gone.pid) == 0
