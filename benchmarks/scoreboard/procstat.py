"""CPU and memory of processes from /proc, and a description of the machine."""

from __future__ import annotations

import os
import platform
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Cpu:
    """CPU seconds of a process: its own, and its waited-for children's (kubectl runs)."""

    own: float
    children: float


def cpu(pid: int) -> Cpu:
    """``utime+stime`` and ``cutime+cstime`` of ``pid``; zeros when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return Cpu(0.0, 0.0)
    fields = stat.rsplit(")", 1)[1].split()
    # fields[0] is field 3 (state): utime is field 14, stime 15, cutime 16, cstime 17.
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return Cpu((utime + stime) / TICK, (cutime + cstime) / TICK)


def context_switches(pid: int) -> int:
    """Context switches of ``pid``'s live threads so far (voluntary and not; a thread that has
    ended takes its count with it); 0 when the process is gone. A thread that waits for
    another's interpreter lock switches out: many per request show threads handing the lock
    around."""
    total = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            for line in status.read_text().splitlines():
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    total += int(line.split(":", 1)[1])
        except (OSError, ValueError):
            continue
    return total


def memory_kb(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of ``pid`` in kB."""
    out: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])
    except OSError:
        pass
    return out


def snapshot(pids: Mapping[str, int]) -> dict[str, Cpu]:
    return {name: cpu(pid) for name, pid in pids.items()}


def cpu_delta(before: Mapping[str, Cpu], after: Mapping[str, Cpu]) -> dict[str, float]:
    """CPU seconds spent between two snapshots, per process; a daemon's children (its kubectl
    runs) are reported as ``kubectl``."""
    out: dict[str, float] = {}
    for name, b in before.items():
        a = after.get(name, b)
        out[name] = round(a.own - b.own, 3)
        if name == "daemon":
            out["kubectl"] = round(a.children - b.children, 3)
    return out


def _first(path: str, key: str) -> str:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _version(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else ""


def machine(*, apiserver: str = "", kubectl: str = "") -> dict[str, object]:
    mem_kb = _first("/proc/meminfo", "MemTotal").split()
    return {
        "cpu_model": _first("/proc/cpuinfo", "model name"),
        "cpus": os.cpu_count(),
        "memory_gb": round(int(mem_kb[0]) / 1024 / 1024, 1) if mem_kb else None,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "kube_apiserver": apiserver,
        "kubectl": _version([kubectl, "version", "--client=true"]) if kubectl else "",
        "shared": "other workloads may run on the same cores: compare ratios within one run",
    }
