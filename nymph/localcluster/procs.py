"""Child processes of the local cluster: they die with the launcher and stop together."""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from nymph.errors import NymphError

#: Ports :func:`free_port` handed out lately: the kernel may give a port just released to the
#: next bind, so two listeners picked one after the other could otherwise get the same one.
_RECENT_PORTS: collections.deque[int] = collections.deque(maxlen=512)
_PORTS_LOCK = threading.Lock()


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def free_port() -> int:
    """A free 127.0.0.1 TCP port, never one this process was given in its last 512 calls."""
    with _PORTS_LOCK:
        for _ in range(64):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", 0))
                port = int(s.getsockname()[1])
            if port not in _RECENT_PORTS:
                break
        _RECENT_PORTS.append(port)
        return port


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    os.setsid()


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def tail(self, n: int = 2000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""


def spawn(name: str, argv: Sequence[str], *, logdir: Path, env: Mapping[str, str] | None = None) -> Proc:
    """Start ``argv`` in its own session, output to ``<logdir>/<name>.log``; SIGKILL from the
    kernel if this process dies (``PR_SET_PDEATHSIG``)."""
    log = logdir / f"{name}.log"
    with log.open("ab") as fh:
        popen = subprocess.Popen(
            list(argv),
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=logdir,
            env=None if env is None else dict(env),
            preexec_fn=_die_with_parent,
        )
    return Proc(name=name, popen=popen, log=log)


class ProcessesSurvived(NymphError):
    """Processes still running 5 s after SIGKILL (held in the kernel, e.g. on a hung mount)."""


def stop_all(procs: Sequence[Proc], *, grace: float = 5.0) -> None:
    """Stop the processes one by one, last started first (the API server exits in about a
    second while etcd is up, but waits out its timeouts when etcd goes at the same time):
    SIGTERM to the process group, SIGKILL after ``grace`` seconds. One that outlives its SIGKILL
    does not keep the others running: each is stopped, then :class:`ProcessesSurvived` names
    those still there."""
    survived: list[str] = []
    for p in reversed(procs):
        if p.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.popen.pid, signal.SIGTERM)
        try:
            p.popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.popen.pid, signal.SIGKILL)
            try:
                p.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                survived.append(f"{p.name} (pid {p.popen.pid}, log {p.log})")
    if survived:
        raise ProcessesSurvived("still running after SIGKILL: " + "; ".join(survived))


class Restarter:
    """Starts a child that keeps no state of its own (kwok: all it knows is in the API server)
    again when it exits on its own, at most ``limit`` times, and says so in its log and through
    ``say``. kwok 0.7 and 0.8 can die of a data race in their CEL set-up ("concurrent map
    writes") the first time two of their stages see an object at once; a cluster whose simulator
    died would stall every Pod on its nodes.

    :attr:`proc` is the child running now, and the restarter puts each new one in its place in
    ``procs``, so whoever stops ``procs`` stops it; ``before_restart`` runs before each new one
    (for kwok: release the node leases the dead one held). :meth:`stop` first: once it returns,
    no new child starts, and one started before it is in ``procs``. :attr:`gave_up` holds the
    exit code the last time, once the ``limit`` is used up or a new child cannot be started.

    The kernel's ``PR_SET_PDEATHSIG`` (see :func:`spawn`) fires when the *thread* that started
    a child ends, not the process: the restarter's thread starts the new children, so it ends
    only once the child it started has ended (``stop_all`` stops it as it stops the others)."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        logdir: Path,
        procs: list[Proc],
        limit: int = 5,
        backoff: float = 0.5,
        say: Callable[[str], None] | None = None,
        before_restart: Callable[[], None] | None = None,
    ) -> None:
        self.name, self.argv, self.logdir = name, list(argv), logdir
        self.limit, self.backoff, self.say = limit, backoff, say
        self.before_restart = before_restart
        self.restarts = 0
        self.gave_up: int | None = None
        self._procs = procs
        self._stopping = threading.Event()
        #: held while a new child is started and put in ``procs``; :meth:`stop` waits for it
        self._starting = threading.Lock()
        self.proc = spawn(name, self.argv, logdir=logdir)
        #: every child started, the running one last (see :meth:`replaced`)
        self._children = [self.proc]
        procs.append(self.proc)
        self._thread = threading.Thread(target=self._watch, name=f"{name}-restarter", daemon=True)
        self._thread.start()

    def replaced(self, p: Proc) -> bool:
        """Whether ``p`` is one of this restarter's children that it starts again or started
        again when it died, i.e. not a death to report: while the restarter has not given up,
        any of its children, the one running and those it replaced. (Asking whether ``p`` is
        :attr:`proc` would race a restart: a reader that found the dead child in ``procs``
        could see the new one in :attr:`proc` a moment later.)"""
        return self.gave_up is None and any(p is c for c in self._children)

    def _watch(self) -> None:
        try:
            self._restart_while_needed()
        finally:
            # a child started on this thread dies with it (PR_SET_PDEATHSIG): outlive it
            while self.proc is not self._children[0] and self.proc.popen.poll() is None:
                time.sleep(0.2)

    def _restart_while_needed(self) -> None:
        while not self._stopping.is_set():
            try:
                code = self.proc.popen.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                continue
            if self._stopping.is_set():
                return
            if self.restarts >= self.limit:
                self.gave_up = code
                self._note(
                    f"{self.name} exited with code {code}; not started again ({self.limit} restarts used)"
                )
                return
            self.restarts += 1
            self._note(
                f"{self.name} exited with code {code}; starting it again ({self.restarts} of {self.limit})"
            )
            if self._stopping.wait(self.backoff * self.restarts):
                return
            if self.before_restart is not None:
                try:
                    self.before_restart()
                except Exception as exc:  # said, and the child starts anyway
                    self._note(f"before starting {self.name} again: {exc}")
            with self._starting:
                if self._stopping.is_set():
                    return
                try:
                    new = spawn(self.name, self.argv, logdir=self.logdir)
                except Exception as exc:  # the binary gone, no file descriptors left, ...
                    self.gave_up = code
                    self._note(f"{self.name} could not be started again: {exc}")
                    return
                self._children.append(new)
                # ``procs`` first: whoever reads it meanwhile sees the dead child or the new one,
                # both :meth:`replaced` (see LocalCluster._check_alive)
                if self.proc in self._procs:
                    self._procs[self._procs.index(self.proc)] = new
                else:
                    self._procs.append(new)
                self.proc = new

    def _note(self, line: str) -> None:
        with contextlib.suppress(OSError), self.proc.log.open("a") as fh:
            fh.write(f"\n--- nymph: {line} ---\n")
        if self.say is not None:
            with contextlib.suppress(Exception):
                self.say(line)

    def stop(self) -> None:
        """Start no new child from now on (the one running stays, for ``stop_all``); a
        ``before_restart`` still running (an API server that does not answer) is not waited for,
        nor the thread, which ends once its own child has (see the class)."""
        self._stopping.set()
        with self._starting:
            pass  # a child being started is in ``procs`` by now
