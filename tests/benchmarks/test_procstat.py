"""The benchmarks' process readings from /proc."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from benchmarks.scoreboard.procstat import context_switches


def test_context_switches_count_every_live_thread_of_a_process_and_nothing_for_one_gone() -> None:
    """A thread's sleeps are switches of its process while the thread lives: a helper thread
    that sleeps 20 times adds at least 20 (read before it ends: an ended thread's count goes
    with it); a process that has ended reads 0, not an error."""
    slept = threading.Event()
    release = threading.Event()
    before = context_switches(os.getpid())

    def nap() -> None:
        for _ in range(20):
            time.sleep(0.001)
        slept.set()
        release.wait(10)

    t = threading.Thread(target=nap, name="procstat-test-nap")
    t.start()
    try:
        assert slept.wait(10)
        assert context_switches(os.getpid()) - before >= 20
    finally:
        release.set()
        t.join(10)

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert context_switches(gone.pid) == 0
