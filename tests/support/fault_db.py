"""Where the fault suite's queue keeps its state, as a fault of its own.

``NYMPH_FAULT_BACKEND`` chooses: ``sqlite`` (a file in the test's temp dir), ``pg`` (a fresh
database on the session's real PostgreSQL server, :mod:`tests.support.pg_server`, that the queue
reaches through the latency proxy, :mod:`tests.support.latency_proxy`, run as a process of its
own, ``NYMPH_PG_DELAY_MS`` each way, default 1), or ``sqlite,pg`` (both, one after the other:
the default, so ``make test`` and ``make faults`` run both). The test reads what a stage shows (a task leased) from the
same database, on its own connection; on PostgreSQL the server can be restarted mid-run. The
proxy is stopped, the database dropped and the server left running at the end, pass or fail.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg

from tests.support.hygiene_plugin import stop_process, track
from tests.support.latency_proxy import pg_url_through
from tests.support.pg_server import PgServer

ALIASES = {"sqlite": "sqlite", "pg": "postgresql", "postgresql": "postgresql"}
LEASED = "SELECT task_id FROM tasks WHERE status = 'leased' AND kind = {}"


def backends() -> list[str]:
    """The backends ``NYMPH_FAULT_BACKEND`` names (comma-separated), in its order."""
    names = [n.strip().lower() for n in os.environ.get("NYMPH_FAULT_BACKEND", "sqlite,pg").split(",")]
    unknown = [n for n in names if n not in ALIASES]
    if unknown:
        raise ValueError(f"NYMPH_FAULT_BACKEND: unknown {unknown} (sqlite, pg)")
    return list(dict.fromkeys(ALIASES[n] for n in names if n)) or ["sqlite"]


def delay_ms() -> float:
    return float(os.environ.get("NYMPH_PG_DELAY_MS", "1"))


@dataclass
class FaultDb:
    """The queue's ``--db`` (``queue_db``) and the test's own view of the same database."""

    backend: str
    queue_db: Path | str
    server: PgServer | None = None
    #: The database's own URL (the server's unix socket, no proxy): the test's reads.
    direct: str = ""
    delay_ms: float = 0.0
    _conn: psycopg.Connection[tuple[object, ...]] | None = None

    @property
    def label(self) -> str:
        if self.server is None:
            return self.backend
        return f"{self.backend} ({self.delay_ms:g} ms each way)"

    def leased(self, kind: str) -> set[str]:
        """Task ids the database shows leased (empty while it cannot be read: the queue or the
        server may be down)."""
        if self.server is None:
            try:
                con = sqlite3.connect(f"file:{self.queue_db}?mode=ro", uri=True, timeout=1)
                try:
                    rows = con.execute(LEASED.format("?"), (kind,)).fetchall()
                finally:
                    con.close()
            except sqlite3.Error:
                return set()
            return {str(r[0]) for r in rows}
        try:
            if self._conn is None or self._conn.closed:
                self._conn = psycopg.connect(self.direct, autocommit=True, connect_timeout=1)
            found = self._conn.execute(LEASED.format("%s"), (kind,)).fetchall()  # type: ignore[arg-type]
        except psycopg.Error:
            self.close()
            return set()
        return {str(r[0]) for r in found}

    def stop_server(self) -> None:
        """Stop the PostgreSQL server (fast shutdown: what was committed stays)."""
        assert self.server is not None
        self.close()
        self.server.stop()

    def start_server(self) -> None:
        assert self.server is not None
        self.server.start()

    def secret_roots(self) -> list[Path]:
        """Where the database writes (scanned for secrets beside the test's temp dir)."""
        return [] if self.server is None else [self.server.root]

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()


@contextlib.contextmanager
def latency_proxy(server: PgServer, delay: float) -> Iterator[int]:
    """The latency proxy in front of ``server``, as a process of its own: its port."""
    socket = str(server.socket_dir / f".s.PGSQL.{server.port}")
    cmd = [sys.executable, "-m", "tests.support.latency_proxy", "--target-unix", socket]
    proc = track(
        subprocess.Popen(
            [*cmd, "--delay-ms", str(delay)], stdout=subprocess.PIPE, text=True, start_new_session=True
        )
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("listening on "), f"the latency proxy did not start: {line!r}"
        yield int(line.split()[-1])
    finally:
        stop_process(proc)


@contextlib.contextmanager
def fault_db(backend: str, tmp: Path, server: Callable[[], PgServer]) -> Iterator[FaultDb]:
    """The queue's database on ``backend``; ``server`` gives the session's PostgreSQL server
    (asked only on PostgreSQL)."""
    if backend == "sqlite":
        yield FaultDb(backend=backend, queue_db=tmp / "queue.db")
        return
    pg = server()
    url = pg.fresh_database()
    db = FaultDb(backend=backend, queue_db=url, server=pg, direct=url, delay_ms=delay_ms())
    try:
        with latency_proxy(pg, db.delay_ms) as port:
            db.queue_db = pg_url_through(url, port)
            yield db
    finally:
        db.close()
        if pg.proc is None or pg.proc.poll() is not None:  # the test failed while it was down
            pg.stop()
            pg.start()  # the session's other tests need it
        pg.drop_database(url)
