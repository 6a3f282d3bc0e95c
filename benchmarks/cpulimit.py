"""A CPU limit for a benchmark's processes, as a Pod's ``resources.limits.cpu`` sets one: a
cgroup of their own with a CFS quota (cgroup v2 ``cpu.max``, or v1 ``cpu.cfs_quota_us``).

Used where a figure needs each process to have the same fixed share of the machine whatever
else runs (the PostgreSQL replicas of ``pg_bench.py``, each as if on a node of its own). Needs
root; without a writable cpu controller :func:`cpu_limits` says why and limits nothing. Every
group it makes is removed when the block ends (its processes moved back first), also on
failure; a group left by a benchmark killed with SIGKILL (its creator's pid is in its name) is
removed by the next one.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from nymph.localcluster.procs import pid_alive

CGROUP = Path("/sys/fs/cgroup")
PREFIX = "nymph-bench-"
#: The CFS period: the quota is spent within each 10 ms (a tenth of the kubelet's default), so a
#: held process pauses for a few milliseconds at a time, never for most of 100 ms (a pause that
#: long mid-transaction holds its locks and makes others wait, which a slower machine would not).
PERIOD_US = 10_000
_seq = itertools.count()


class NoCpuLimit(Exception):
    """This machine gives no cgroup cpu controller this process may write."""


def _root() -> tuple[Path, bool]:
    """The cgroup directory new groups go under, and whether it is cgroup v2."""
    if (CGROUP / "cgroup.controllers").exists():
        if "cpu" not in (CGROUP / "cgroup.subtree_control").read_text().split():
            raise NoCpuLimit("the cgroup v2 root does not delegate the cpu controller")
        return CGROUP, True
    for name in ("cpu", "cpu,cpuacct"):
        if (CGROUP / name / "cpu.cfs_quota_us").exists():
            return CGROUP / name, False
    raise NoCpuLimit(f"no cpu controller under {CGROUP}")


def _remove(group: Path, root: Path) -> None:
    """Move what is left in ``group`` back to ``root`` and remove it."""
    with contextlib.suppress(FileNotFoundError):
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (root / "cgroup.procs").write_text(pid)
    with contextlib.suppress(FileNotFoundError):
        group.rmdir()


@dataclass
class CpuLimits:
    """Groups made by :func:`cpu_limits`; ``reason`` says why none can be (nothing is limited)."""

    root: Path | None
    v2: bool
    reason: str = ""
    groups: list[Path] = field(default_factory=list)

    def limit(self, pid: int, cores: float) -> bool:
        """Put ``pid`` in a new group of its own, held to ``cores`` CPUs; False if none can be."""
        if self.root is None:
            return False
        group = self.root / f"{PREFIX}{os.getpid()}-{next(_seq)}"
        group.mkdir()
        self.groups.append(group)
        quota = max(1000, int(cores * PERIOD_US))
        if self.v2:
            (group / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        else:
            (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(quota))
        (group / "cgroup.procs").write_text(str(pid))
        return True


def _sweep(root: Path) -> None:
    """Remove the groups of benchmarks no longer running."""
    for group in root.glob(f"{PREFIX}*"):
        owner = group.name[len(PREFIX) :].split("-", 1)[0]
        if owner.isdigit() and not pid_alive(int(owner)):
            _remove(group, root)


@contextlib.contextmanager
def cpu_limits() -> Iterator[CpuLimits]:
    """Groups for CPU limits, all removed at the end of the block."""
    try:
        root, v2 = _root()
        probe = root / f"{PREFIX}{os.getpid()}-probe"
        probe.mkdir()
        probe.rmdir()
    except (NoCpuLimit, OSError) as exc:
        yield CpuLimits(root=None, v2=False, reason=str(exc) or exc.__class__.__name__)
        return
    _sweep(root)
    limits = CpuLimits(root=root, v2=v2)
    try:
        yield limits
    finally:
        for group in reversed(limits.groups):
            _remove(group, root)
