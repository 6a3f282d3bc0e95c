"""Keeping the long-running daemon's memory flat.

Two process-wide settings, made once before the event loop starts:

* **Two malloc arenas.** glibc gives each thread that allocates its own arena (up to eight per
  core). The daemon's short-lived worker threads (fsyncs, DNS, subprocess waits) then leave
  freed memory spread over many arenas, where it stays in the RSS as fragmentation. Two are
  plenty for one event loop and a few helpers. An operator's ``MALLOC_ARENA_MAX`` wins.
* **Child processes waited for by pidfd** (Python 3.11; later versions do it themselves): the
  default watcher starts a thread per kubectl run, each of which may claim an arena.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import platform
import sys
import warnings

#: ``mallopt`` parameter number of ``M_ARENA_MAX`` (glibc's malloc.h).
_M_ARENA_MAX = -8
ARENAS = 2


def limit_malloc_arenas(arenas: int = ARENAS) -> bool:
    """Cap glibc's malloc arenas (unless ``MALLOC_ARENA_MAX`` is set); True when applied."""
    if os.environ.get("MALLOC_ARENA_MAX") or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(_M_ARENA_MAX, arenas))
    except (OSError, AttributeError):
        return False


def wait_children_by_pidfd() -> bool:
    """Use the pidfd child watcher where Python still has watchers to choose (before 3.12);
    True when set."""
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            fd = os.pidfd_open(os.getpid())  # the kernel supports it (Linux 5.3+)
        except OSError:
            return False
        os.close(fd)
        with contextlib.suppress(Exception):
            asyncio.set_child_watcher(asyncio.PidfdChildWatcher())  # type: ignore[attr-defined,unused-ignore]
            return True
    return False


def tune_process() -> dict[str, bool]:
    """Both settings; what was applied (for the start-up log)."""
    return {"malloc_arenas_capped": limit_malloc_arenas(), "pidfd_child_watcher": wait_children_by_pidfd()}
