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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

#: Ports :func:`free_port` handed out lately: the kernel may give a port just released to the
#: next bind, so two listeners picked one after the other could otherwise get the same one.
_RECENT_PORTS: collections.deque[int] = collections.deque(maxlen=512)
_PORTS_LOCK = threading.Lock()


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


def stop_all(procs: Sequence[Proc], *, grace: float = 5.0) -> None:
    """Stop the processes one by one, last started first (the API server exits in about a
    second while etcd is up, but waits out its timeouts when etcd goes at the same time):
    SIGTERM to the process group, SIGKILL after ``grace`` seconds."""
    for p in reversed(procs):
        if p.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.popen.pid, signal.SIGTERM)
        try:
            p.popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.popen.pid, signal.SIGKILL)
            p.popen.wait(timeout=5)
