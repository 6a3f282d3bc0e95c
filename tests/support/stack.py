"""The real queue and daemon processes the fault tests run, killed and restarted.

Built on tests/support/harness.py (the processes are tracked, so they die with the test). The
queue's database is a SQLite file or a PostgreSQL database behind the latency proxy
(tests/support/fault_db.py); on PostgreSQL the server is one more thing to stop and start. Every
kill and every restart is counted in the suite's tally; a restart that does not come up healthy
is counted as failed (and the daemon is started again so the run can go on and say so at the end).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nymph.localcluster import LocalCluster
from tests.support.fault_db import FaultDb
from tests.support.harness import DaemonProc, QueueProc, daemon_kubeconfig, nymph, setup_provider
from tests.support.tally import TALLY


@dataclass
class FaultStack:
    kube: LocalCluster
    namespace: str
    tmp: Path
    queue: QueueProc
    daemon: DaemonProc
    db: FaultDb
    extra: tuple[str, ...] = ()
    restarts: int = 0
    failed_restarts: list[str] = field(default_factory=list)

    @property
    def root(self) -> Path:
        return self.daemon.root

    @property
    def audit_log(self) -> Path:
        return self.root / "audit.jsonl"

    # -- kills and restarts ------------------------------------------------------------------

    def kill_daemon(self) -> None:
        """kill -9 the daemon's whole process group (its kubectl children die with it, as they
        would with the container)."""
        self.daemon.kill()
        TALLY.kills += 1

    def restart_daemon(self) -> None:
        d = DaemonProc(self.queue, self.daemon.kubeconfig, self.namespace, self.daemon.root, extra=self.extra)
        self.daemon = d
        self.restarts += 1
        try:
            d.start()
            time.sleep(0.3)
            if d.proc is None or d.proc.poll() is not None:
                raise AssertionError(f"exited with {d.proc.returncode if d.proc else '?'}")
        except AssertionError as exc:
            TALLY.restarts_failed += 1
            self.failed_restarts.append(
                f"daemon restart {self.restarts}: {exc}; log: {self.daemon_log()[-1500:]}"
            )
            d.kill()
            time.sleep(1)
            d2 = DaemonProc(self.queue, d.kubeconfig, self.namespace, d.root, extra=self.extra)
            self.daemon = d2
            with contextlib.suppress(AssertionError):
                d2.start()

    def kill_queue(self) -> None:
        self.queue.kill()
        TALLY.kills += 1

    def restart_queue(self) -> None:
        self.restarts += 1
        try:
            self.queue.start()
        except AssertionError as exc:
            TALLY.restarts_failed += 1
            self.failed_restarts.append(f"queue restart: {exc}")

    def stop_database(self) -> None:
        """Stop the PostgreSQL server under the running queue (fast shutdown)."""
        self.db.stop_server()
        TALLY.kills += 1

    def start_database(self) -> None:
        self.restarts += 1
        try:
            self.db.start_server()
        except RuntimeError as exc:
            TALLY.restarts_failed += 1
            self.failed_restarts.append(f"database restart: {str(exc)[-600:]}")

    def daemon_log(self) -> str:
        path = self.root.parent / f"daemon-{self.root.name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # -- what is visible from outside ---------------------------------------------------------

    def audit_records(self) -> list[dict[str, Any]]:
        out = []
        try:
            text = self.audit_log.read_text(errors="replace")
        except FileNotFoundError:
            return []
        for line in text.splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def audit_count(self, action: str, result: str | None = None) -> int:
        return sum(
            1
            for r in self.audit_records()
            if r.get("action") == action and (result is None or r.get("result") == result)
        )

    def leased(self, kind: str) -> set[str]:
        """Task ids the queue's database shows leased (read on the test's own connection; the
        queue may be down)."""
        return self.db.leased(kind)

    def workdirs(self) -> set[str]:
        work = self.root / "work"
        try:
            return {p.name for p in work.iterdir()}
        except OSError:
            return set()

    def kubectl_children(self) -> list[int]:
        proc = self.daemon.proc
        if proc is None or proc.poll() is not None:
            return []
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(stat[1]) == proc.pid and b"kubectl" in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
        return found

    def audit_verify(self) -> subprocess.CompletedProcess[str]:
        return nymph("audit", "verify", str(self.audit_log))


def start_stack(
    kube: LocalCluster,
    namespace: str,
    tmp: Path,
    *,
    db: FaultDb | None = None,
    extra: tuple[str, ...] = (),
) -> FaultStack:
    """The queue (on ``db``; default a SQLite file in ``tmp``) and a daemon, with tokens and the
    local provider."""
    db = db or FaultDb(backend="sqlite", queue_db=tmp / "queue.db")
    q = QueueProc(db.queue_db, log_dir=tmp)
    q.tokens()
    q.start()
    kc = daemon_kubeconfig(kube, namespace, tmp)
    asyncio.run(setup_provider(q, namespace))
    d = DaemonProc(q, kc, namespace, tmp / "root", extra=extra)
    d.start()
    return FaultStack(kube=kube, namespace=namespace, tmp=tmp, queue=q, daemon=d, db=db, extra=extra)


def stop_stack(stack: FaultStack) -> None:
    for p in (stack.daemon, stack.queue):
        p.kill()


def running_stack(
    kube: LocalCluster,
    namespace: str,
    tmp: Path,
    *,
    db: FaultDb | None = None,
    extra: tuple[str, ...] = (),
) -> Iterator[FaultStack]:
    s = start_stack(kube, namespace, tmp, db=db, extra=extra)
    try:
        yield s
    finally:
        stop_stack(s)
