"""One daemon per workdir root: an exclusive ``flock`` on ``<root>/daemon.lock``.

The audit log, the outbox and the workdirs under a root are written by one process at a time.
Two daemons on one root happen for real: a DaemonSet creates the replacement of a deleted Pod
while the old one is still terminating (flushing its outbox), and a rolling update with surge
does the same. The new daemon waits here, saying so, until the old one has exited; the kernel
drops the lock of a process that dies, so a killed daemon never blocks its successor.

A root that cannot hold the lock file (read-only, full, not a directory) does not stop the
daemon: it starts unlocked, says so, and the disk health check keeps it from claiming.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from pathlib import Path

from nymph.logsetup import get_logger

LOCK_NAME = "daemon.lock"


class RootLock:
    """``flock(LOCK_EX)`` on ``<root>/daemon.lock``, held until :meth:`release` or exit."""

    def __init__(self, root: Path) -> None:
        self.path = Path(root) / LOCK_NAME
        self.fd: int | None = None
        self.log = get_logger("rootlock", path=str(self.path))

    @property
    def held(self) -> bool:
        return self.fd is not None

    def try_acquire(self) -> bool:
        """Take the lock if it is free; raise OSError if the lock file cannot be opened."""
        if self.fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except OSError:
            os.close(fd)
            raise
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return True

    async def acquire(self, *, stopping: asyncio.Event, poll: float = 0.5) -> bool:
        """Wait for the lock; False if ``stopping`` was set first. A root where the lock file
        cannot be created counts as acquired (unlocked), with a warning."""
        waited = False
        while not stopping.is_set():
            try:
                if self.try_acquire():
                    if waited:
                        self.log.info("the other daemon on this root has exited; starting")
                    return True
            except OSError as exc:
                self.log.warning(
                    "cannot lock the workdir root; starting without the lock",
                    error=f"{exc.__class__.__name__}: {exc.strerror or exc}",
                )
                return True
            if not waited:
                self.log.warning("another daemon holds this workdir root; waiting for it to exit")
                waited = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), poll)
        return False

    def release(self) -> None:
        if self.fd is None:
            return
        with contextlib.suppress(OSError):
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None
