"""Whether the daemon can write its root (audit log, outbox, workdirs).

A failed write (the audit log, the outbox, a workdir: ENOSPC, EROFS, EIO...) marks the root
unwritable. While it is, ``/readyz`` answers 503 and nothing is claimed; a small write test
(create, write, fsync, remove a file in each directory) is repeated every few seconds, and the
first one that succeeds everywhere clears the mark, so the daemon resumes without a restart.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from nymph.daemon.durable import Writer
from nymph.logsetup import get_logger

PROBE_NAME = ".nymph-write-test"


class DiskHealth:
    def __init__(
        self, *, directories: Sequence[Path] = (), interval: float = 2.0, write: Writer | None = None
    ) -> None:
        self.directories = tuple(Path(d) for d in directories)
        self.interval = interval
        self._write = write  # a seam for tests injecting a failing write
        self.problem: str | None = None  # why the root is unwritable, None while it is fine
        self.cause: str | None = None  # the failed write that marked it
        self.since: float | None = None
        self.changed = asyncio.Event()  # set when the root becomes writable again
        self.on_writable: list[Callable[[], None]] = []  # called when it does
        self.log = get_logger("disk")

    @property
    def ok(self) -> bool:
        return self.problem is None

    def failed(self, what: str, error: BaseException | str) -> None:
        """A write under the root failed: mark it unwritable until a write test succeeds."""
        detail = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        problem = f"{what}: {detail}"[:500]
        if self.problem is None:
            self.since = time.monotonic()
            self.log.error("the daemon's root cannot be written; claiming paused", problem=problem)
        self.cause = self.problem = problem
        self.changed.clear()

    def write_test(self) -> str | None:
        """Write, fsync and remove a small file in each directory; why it failed, or None."""
        for directory in self.directories:
            path = directory / PROBE_NAME
            try:
                directory.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                try:
                    data = b"nymph write test\n"
                    if (self._write or os.write)(fd, data) != len(data):
                        return f"{directory}: short write"
                    os.fsync(fd)
                finally:
                    os.close(fd)
                path.unlink()
            except OSError as exc:
                return f"{directory}: {exc.strerror or exc}"
        return None

    def check(self) -> bool:
        """While marked unwritable: run the write test; clear the mark when it succeeds."""
        if self.problem is None:
            return True
        problem = self.write_test()
        if problem is not None:
            self.problem = f"{self.cause}; write test: {problem}"[:1000]
            return False
        self.log.info("the daemon's root is writable again; claiming resumes")
        self.problem = self.cause = None
        self.since = None
        self.changed.set()
        for callback in self.on_writable:
            callback()
        return True

    async def run(self) -> None:
        """Repeat the write test every ``interval`` seconds while the root is marked unwritable."""
        while True:
            await asyncio.sleep(self.interval)
            self.check()

    async def wait_writable(self) -> None:
        """Return once the root is writable (at once when it is)."""
        while not self.ok:
            self.changed.clear()
            if self.check():
                return
            try:
                await asyncio.wait_for(self.changed.wait(), self.interval)
            except TimeoutError:
                continue
