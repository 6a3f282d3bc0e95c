"""What a real node changes on the host, recorded so it can always be undone.

Every real node runs in a **slot** of a machine-wide state root (``/var/lib/nymph-node`` or
``$NYMPH_NODE_STATE_ROOT``): ``<root>/<slot>/`` is its state directory and
``<root>/<slot>.json`` records its owner (pid and start time). Claiming a slot first sweeps every
slot whose owner is gone (a launcher killed with SIGKILL runs no cleanup code), then records the
host sysctls kubelet rewrites if no other live node did. :func:`sweep` removes all a node left:
processes (kubelet, containerd, the runc shims that outlive containerd, and everything in the
node's cgroups), mounts under the state dir (rootfs overlays, tmpfs volumes, network
namespaces), the bridge and its veths, the cgroup directories, stale shim sockets and the state
dir itself. The last node to go restores the sysctls.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from nymph.errors import NymphError
from nymph.localcluster.nodeconfig import KUBELET_SYSCTLS, MAX_SLOTS, NodeLayout

SHIM_SOCKETS = Path("/run/containerd/s")
#: Host directories kubelet, containerd or the CNI plugins create at fixed paths whatever their
#: configuration says (deepest first). Those the first live node finds missing are removed by
#: the last one to go; only kubelet's device-plugin socket directory is emptied first.
HOST_DIRS = (
    "/var/lib/kubelet/device-plugins",
    "/var/lib/kubelet",
    "/var/log/containers",
    "/var/lib/cni/results",
    "/var/lib/cni",
    "/run/containerd/s",
    "/run/containerd",
)
MNT_DETACH = 2


class HostError(NymphError):
    pass


def state_root() -> Path:
    return Path(os.environ.get("NYMPH_NODE_STATE_ROOT") or "/var/lib/nymph-node")


@dataclass(frozen=True)
class Owner:
    pid: int
    start: str

    @staticmethod
    def me() -> Owner:
        return Owner(pid=os.getpid(), start=_start_time(os.getpid()))

    def alive(self) -> bool:
        return _start_time(self.pid) == self.start != ""


def _start_time(pid: int) -> str:
    """The process's start time (clock ticks since boot), "" if it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    fields = stat.rsplit(")", 1)[1].split()
    return "" if fields[0] in ("Z", "X") else fields[19]


@contextlib.contextmanager
def locked(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with (root / "lock").open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def records(root: Path) -> dict[int, Owner]:
    out: dict[int, Owner] = {}
    for f in root.glob("*.json"):
        if not f.stem.isdigit():
            continue
        try:
            data = json.loads(f.read_text())
            out[int(f.stem)] = Owner(pid=int(data["pid"]), start=str(data["start"]))
        except (OSError, ValueError, KeyError):
            out[int(f.stem)] = Owner(pid=0, start="")
    return out


def claim_slot(*, root: Path | None = None) -> NodeLayout:
    """Sweep what dead runs left, record the sysctls if no live node did, claim a free slot."""
    root = root or state_root()
    with locked(root):
        live = records(root)
        for slot, owner in sorted(live.items()):
            if not owner.alive():
                sweep(NodeLayout(slot=slot, state_dir=root / str(slot)))
                (root / f"{slot}.json").unlink(missing_ok=True)
                del live[slot]
        saved, dirs = root / "sysctls.json", root / "host-dirs.json"
        if not live:
            restore_sysctls(saved)
            remove_created_dirs(dirs)
        if not saved.exists():
            saved.write_text(json.dumps(read_sysctls()))
        if not dirs.exists():
            dirs.write_text(json.dumps([d for d in HOST_DIRS if not Path(d).exists()]))
        free = next((s for s in range(MAX_SLOTS) if s not in live), None)
        if free is None:
            raise HostError(f"all {MAX_SLOTS} real-node slots under {root} are in use")
        me = Owner.me()
        (root / f"{free}.json").write_text(json.dumps({"pid": me.pid, "start": me.start}))
        layout = NodeLayout(slot=free, state_dir=root / str(free))
        remove_tree(layout.state_dir)
        layout.state_dir.mkdir(parents=True)
        return layout


def release_slot(layout: NodeLayout, *, root: Path | None = None) -> list[str]:
    """Sweep this node's slot and free it; the last live node restores the sysctls."""
    root = root or state_root()
    with locked(root):
        problems = sweep(layout)
        (root / f"{layout.slot}.json").unlink(missing_ok=True)
        if not any(o.alive() for o in records(root).values()):
            restore_sysctls(root / "sysctls.json")
            remove_created_dirs(root / "host-dirs.json")
    return problems


# -- sysctls ---------------------------------------------------------------------------------


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def read_sysctls() -> dict[str, str]:
    out = {}
    for name in KUBELET_SYSCTLS:
        with contextlib.suppress(OSError):
            out[name] = _sysctl_path(name).read_text().strip()
    return out


def restore_sysctls(saved: Path) -> None:
    if not saved.exists():
        return
    values: dict[str, str] = json.loads(saved.read_text())
    for name, value in values.items():
        with contextlib.suppress(OSError):
            if _sysctl_path(name).read_text().strip() != value:
                _sysctl_path(name).write_text(value)
    saved.unlink()


def remove_created_dirs(saved: Path) -> None:
    """Remove the host directories recorded as created by the nodes (if empty by now)."""
    if not saved.exists():
        return
    created: list[str] = json.loads(saved.read_text())
    for d in (Path(x) for x in HOST_DIRS if x in created):
        if d.name == "device-plugins":
            for f in d.glob("*"):
                with contextlib.suppress(OSError):
                    f.unlink()
        with contextlib.suppress(OSError):
            d.rmdir()
    saved.unlink()


# -- the sweep -------------------------------------------------------------------------------


def sweep(layout: NodeLayout) -> list[str]:
    """Remove everything the node in ``layout`` may have left; returns what could not be removed."""
    kill_node_processes(layout)
    problems = unmount_under(layout.state_dir)
    delete_bridge(layout.bridge)
    problems += remove_cgroups(layout.cgroup_root)
    remove_stale_shim_sockets()
    for link in Path("/var/log/containers").glob("*.log"):
        with contextlib.suppress(OSError):
            if str(link.readlink()).startswith(str(layout.pod_logs) + "/"):
                link.unlink()
    for cached in Path("/var/lib/cni/results").glob(f"{layout.network}-*"):
        cached.unlink(missing_ok=True)
    if not mounts_under(layout.state_dir):
        remove_tree(layout.state_dir)
    return problems


def remove_tree(path: Path) -> None:
    """``rm -rf`` (several times faster than shutil on an unpacked image), never crossing into
    another filesystem."""
    if path.exists():
        subprocess.run(["rm", "-rf", "--one-file-system", str(path)], capture_output=True, check=False)
    shutil.rmtree(path, ignore_errors=True)


def _pids_in_cgroups(cgroup_root: str) -> set[int]:
    pids: set[int] = set()
    for mnt in cgroup_mounts():
        base = Path(mnt + cgroup_root)
        if not base.is_dir():
            continue
        for procs in base.rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in procs.read_text().split())
    return pids


def _pids_naming(path: Path) -> set[int]:
    """Processes whose command line names ``path`` (kubelet, containerd, the shims)."""
    needle = str(path).encode() + b"/"
    mine = {os.getpid(), os.getppid()}
    pids = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) in mine:
            continue
        with contextlib.suppress(OSError):
            if needle in (d / "cmdline").read_bytes():
                pids.add(int(d.name))
    return pids


def kill_node_processes(layout: NodeLayout, *, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = _pids_naming(layout.state_dir) | _pids_in_cgroups(layout.cgroup_root)
        pids.discard(os.getpid())
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def _unescape(field: str) -> str:
    return field.encode().decode("unicode_escape") if "\\" in field else field


def _mountinfo() -> list[tuple[str, str]]:
    """(mount point, filesystem type) of every mount, in mount order."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        out.append((_unescape(left.split()[4]), right.split()[0]))
    return out


def cgroup_mounts() -> list[str]:
    return [m for m, fs in _mountinfo() if fs in ("cgroup", "cgroup2")]


def mounts_under(path: Path) -> list[str]:
    p = str(path)
    return [m for m, _ in _mountinfo() if m == p or m.startswith(p + "/")]


def unmount_under(path: Path) -> list[str]:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    for _ in range(5):
        mounts = mounts_under(path)
        if not mounts:
            return []
        for m in reversed(mounts):
            libc.umount2(m.encode(), MNT_DETACH)
    return [f"mount left: {m}" for m in mounts_under(path)]


def delete_bridge(bridge: str) -> None:
    if not Path(f"/sys/class/net/{bridge}").exists():
        return
    for port in Path(f"/sys/class/net/{bridge}/brif").glob("*"):
        subprocess.run(["ip", "link", "del", port.name], capture_output=True, check=False)
    subprocess.run(["ip", "link", "del", bridge], capture_output=True, check=False)


def make_cgroups(cgroup_root: str) -> None:
    """The node's cgroup root in every hierarchy (kubelet requires it to exist); a v1 cpuset
    gets its parent's CPUs and memory nodes, without which no process could join it."""
    for mnt in cgroup_mounts():
        base = Path(mnt + cgroup_root)
        base.mkdir(exist_ok=True)
        for knob in ("cpuset.cpus", "cpuset.mems"):
            mine, parent = base / knob, Path(mnt) / knob
            if mine.exists() and not mine.read_text().strip():
                mine.write_text(parent.read_text())


def remove_cgroups(cgroup_root: str, *, timeout: float = 5.0) -> list[str]:
    deadline = time.monotonic() + timeout
    left: list[str] = []
    while True:
        left = []
        for mnt in cgroup_mounts():
            base = Path(mnt + cgroup_root)
            if not base.is_dir():
                continue
            dirs = sorted((d for d in base.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts))
            for d in [*dirs, base]:
                try:
                    d.rmdir()
                except FileNotFoundError:
                    pass
                except OSError:
                    left.append(str(d))
        if not left or time.monotonic() > deadline:
            return [f"cgroup left: {d}" for d in left]
        time.sleep(0.1)


def remove_stale_shim_sockets() -> None:
    """Shim sockets no live process listens on (a killed shim leaves its socket behind)."""
    if not SHIM_SOCKETS.is_dir():
        return
    try:
        listening = {
            line.split()[-1]
            for line in Path("/proc/net/unix").read_text().splitlines()[1:]
            if len(line.split()) >= 8
        }
    except OSError:
        return
    for sock in SHIM_SOCKETS.iterdir():
        if str(sock) not in listening and f"@{sock}" not in listening:
            sock.unlink(missing_ok=True)
    for d in (SHIM_SOCKETS, SHIM_SOCKETS.parent):
        with contextlib.suppress(OSError):
            d.rmdir()
