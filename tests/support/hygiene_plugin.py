"""Every process a test starts is gone when the run ends; otherwise the run fails.

At the start of the session ``NYMPH_TEST_RUN=<uuid>`` is put in ``os.environ``, so every process
the tests start inherits it, even one re-parented to pid 1 after its parent died. At the end
(after every fixture is torn down), the plugin scans ``/proc`` for processes carrying that marker
or still descended from pytest. Any it finds fail the run (exit status 1): they are named with
their command lines, then killed. Mounts left under pytest's temp directories and network devices
named with the tests' prefix (:data:`NETDEV_PREFIX`) fail the run the same way.

Tests that start long-lived processes register them with :func:`track` (or start them through a
helper that does): the plugin kills the process group of each tracked process when the test that
started it ends, pass or fail, so the end-of-run check is a backstop, not the cleanup.

Under pytest-xdist (``make test`` runs on every core) each worker checks the processes its own
tests started and hands what it found to the main process, which reports them; mounts and
network devices are checked once, by the main process, after every worker has ended (a device a
test of one worker made while another worker ended is not that worker's leak).

A SIGTERM to the run (a CI time limit, ``timeout``, ``kill``) interrupts it as Ctrl-C does, so
the fixtures are torn down (a PostgreSQL server or a control plane a fixture started is stopped)
and the end-of-run check still runs; a second SIGTERM ends the run at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.support.xdist_handoff import handed, worker_output

MARKER = "NYMPH_TEST_RUN"
NETDEV_PREFIX = "nymt"
_PROC = Path("/proc")


@dataclass(frozen=True)
class Leak:
    pid: int
    cmdline: str


@dataclass
class _State:
    token: str = ""
    mounts: frozenset[str] = frozenset()
    netdevs: frozenset[str] = frozenset()
    leaks: tuple[Leak, ...] = ()
    mount_leaks: tuple[str, ...] = ()
    netdev_leaks: tuple[str, ...] = ()
    #: A SIGTERM came: the run is being torn down, and the next one ends it.
    terminated: bool = False


_state = _State()
_tracked: list[subprocess.Popen[Any]] = []
P = TypeVar("P", bound="subprocess.Popen[Any]")


def track(proc: P) -> P:
    """Kill ``proc`` (and its process group, when it leads one) when the current test ends."""
    _tracked.append(proc)
    return proc


def stop_process(proc: subprocess.Popen[Any], *, sig: int = signal.SIGKILL, timeout: float = 10) -> None:
    """Signal ``proc``'s process group (or just ``proc``), reap it, then SIGKILL what is left
    of the group it led (children of a daemon that exited on SIGTERM, for example)."""
    if proc.poll() is None:
        try:
            if os.getpgid(proc.pid) == proc.pid:
                os.killpg(proc.pid, sig)
            else:
                proc.send_signal(sig)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
    # While any member is alive the kernel does not reuse the group id, so this hits no stranger.
    if _group_members(proc.pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in _PROC.iterdir():
        if entry.name.isdigit():
            fields = _read(entry / "stat").decode(errors="replace").rsplit(")", 1)[-1].split()
            if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
                members.append(int(entry.name))
    return members


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def _ppid(pid: int) -> int:
    stat = _read(_PROC / str(pid) / "stat").decode(errors="replace")
    try:
        return int(stat.rsplit(")", 1)[1].split()[1])
    except (IndexError, ValueError):
        return 0


def _cmdline(pid: int) -> str:
    return _read(_PROC / str(pid) / "cmdline").replace(b"\0", b" ").decode(errors="replace").strip()


def _is_zombie(pid: int) -> bool:
    stat = _read(_PROC / str(pid) / "stat").decode(errors="replace")
    return stat.rsplit(")", 1)[-1].split()[:1] == ["Z"]


def find_leaks(*, token: str, root: int) -> list[Leak]:
    """Live processes (not ``root`` itself) carrying ``MARKER=token`` or descended from ``root``."""
    needle = f"{MARKER}={token}".encode()
    parents: dict[int, int] = {}
    marked: set[int] = set()
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        parents[pid] = _ppid(pid)
        if needle in _read(entry / "environ").split(b"\0"):
            marked.add(pid)

    def descends(pid: int) -> bool:
        seen: set[int] = set()
        while pid > 1 and pid not in seen:
            seen.add(pid)
            pid = parents.get(pid, 0)
            if pid == root:
                return True
        return False

    found = {pid for pid in parents if pid != root and (pid in marked or descends(pid))}
    return [Leak(pid, _cmdline(pid)) for pid in sorted(found) if not _is_zombie(pid) and _cmdline(pid)]


def _mount_points() -> frozenset[str]:
    points = set()
    for line in _read(_PROC / "self" / "mountinfo").decode(errors="replace").splitlines():
        fields = line.split()
        if len(fields) > 4:
            points.add(fields[4].replace("\\040", " "))
    return frozenset(points)


def _test_tmp_roots(config: pytest.Config) -> list[str]:
    user = os.environ.get("USER") or str(os.getuid())
    roots = [str(Path(tempfile.gettempdir()) / f"pytest-of-{user}")]
    with contextlib.suppress(Exception):
        roots.append(str(Path(tempfile.gettempdir()) / f"pytest-of-{os.getlogin()}"))
    if config.option.basetemp:
        roots.append(str(Path(config.option.basetemp).resolve()))
    return roots


def _netdevs() -> frozenset[str]:
    with contextlib.suppress(OSError):
        return frozenset(p.name for p in Path("/sys/class/net").iterdir())
    return frozenset()


def _interrupted_by_sigterm(signum: int, frame: object) -> None:
    """The first SIGTERM: interrupt the run as Ctrl-C does (teardown and the checks still
    run); the handler is taken away first, so a second one ends the process at once."""
    _state.terminated = True
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise KeyboardInterrupt("SIGTERM")


def _guard_sigterm() -> None:
    """Handle SIGTERM as above, where nothing else handles it: at the start, and again after a
    test whose code took its own handler away (asyncio's ``remove_signal_handler`` leaves the
    default)."""
    if not _state.terminated and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupted_by_sigterm)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    _state.token = uuid.uuid4().hex
    os.environ[MARKER] = _state.token
    _state.mounts = _mount_points()
    _state.netdevs = _netdevs()
    _guard_sigterm()


def pytest_unconfigure(config: pytest.Config) -> None:
    if signal.getsignal(signal.SIGTERM) is _interrupted_by_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.fixture(autouse=True)
def _kill_tracked_processes() -> Iterator[None]:
    start = len(_tracked)
    yield
    while len(_tracked) > start:
        stop_process(_tracked.pop())
    _guard_sigterm()


def _kill(leaks: list[Leak]) -> None:
    for leak in leaks:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(leak.pid, signal.SIGKILL)


#: The key of a worker's leaks in what it hands the main process (pytest-xdist's workeroutput).
WORKER_LEAKS = "nymph_hygiene_leaks"


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """A pytest-xdist worker ended: its leaks become the run's."""
    found = handed(node, WORKER_LEAKS) or []
    _state.leaks += tuple(Leak(pid=int(pid), cmdline=str(cmd)) for pid, cmd in found)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    while _tracked:
        stop_process(_tracked.pop())
    leaks = find_leaks(token=_state.token, root=os.getpid())
    deadline = time.monotonic() + 3  # let processes that were just signalled finish exiting
    while leaks and time.monotonic() < deadline:
        time.sleep(0.1)
        leaks = find_leaks(token=_state.token, root=os.getpid())
    _kill(leaks)
    out = worker_output(session.config)
    if out is not None:  # a worker: the main process reports it, and checks the rest
        out[WORKER_LEAKS] = [(leak.pid, leak.cmdline) for leak in leaks]
        return
    _state.leaks += tuple(leaks)
    roots = _test_tmp_roots(session.config)
    _state.mount_leaks = tuple(
        sorted(
            m for m in _mount_points() - _state.mounts if any(m == r or m.startswith(r + "/") for r in roots)
        )
    )
    _state.netdev_leaks = tuple(sorted(d for d in _netdevs() - _state.netdevs if d.startswith(NETDEV_PREFIX)))
    if _state.leaks or _state.mount_leaks or _state.netdev_leaks:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _state.leaks:
        terminalreporter.section(
            "test hygiene: processes left running after the tests (now killed)", red=True
        )
        for leak in _state.leaks:
            terminalreporter.write_line(f"pid {leak.pid}: {leak.cmdline[:300]}")
    if _state.mount_leaks:
        terminalreporter.section("test hygiene: mounts left under the test temp dirs", red=True)
        for m in _state.mount_leaks:
            terminalreporter.write_line(m)
    if _state.netdev_leaks:
        terminalreporter.section("test hygiene: network devices left by the tests", red=True)
        for d in _state.netdev_leaks:
            terminalreporter.write_line(d)
