"""A real PostgreSQL server for the tests: initdb into a fresh directory, ``postgres`` on a unix
socket there, one database per test cloned from a migrated template, everything removed at the
end (pass or fail).

The server binaries come from Debian's ``postgresql`` package (``tests/envtest/deps.sh``
installs it; ``NYMPH_PG_BIN`` points elsewhere). PostgreSQL refuses to run as root: under root
the data directory is handed to ``nobody`` and the server runs as that user.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

PG_BIN_DIRS = ("/usr/lib/postgresql/17/bin", "/usr/lib/postgresql/16/bin", "/usr/lib/postgresql/15/bin")
TEMPLATE = "nymph_template"
RUN_AS = "nobody"


class PgUnavailable(Exception):
    """No PostgreSQL server binaries on this machine."""


def find_bin() -> Path:
    candidates = [os.environ.get("NYMPH_PG_BIN", ""), *PG_BIN_DIRS]
    for c in candidates:
        if c and (Path(c) / "postgres").is_file() and (Path(c) / "initdb").is_file():
            return Path(c)
    raise PgUnavailable(
        "no PostgreSQL server binaries (initdb, postgres): run tests/envtest/deps.sh as root "
        "(installs Debian's postgresql) or set NYMPH_PG_BIN"
    )


#: How many test databases are dropped together.
DROP_BATCH = 20


@dataclass
class PgServer:
    """One running server; :meth:`fresh_database` hands out a database URL per test."""

    bin_dir: Path
    root: Path
    port: int = 5432
    #: Each commit flushed to disk before it is answered (a production server's settings);
    #: otherwise none is (the tests' speed: nothing here outlives the server's directory).
    durable: bool = False
    proc: subprocess.Popen[bytes] | None = None
    _counter: itertools.count[int] = field(default_factory=itertools.count)
    #: Databases the tests are done with, dropped together (see :meth:`drop_database`).
    _done: list[str] = field(default_factory=list)

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def socket_dir(self) -> Path:
        return self.root / "sock"

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@/{dbname}?host={self.socket_dir}&port={self.port}"

    def _demote(self) -> dict[str, object]:
        if os.geteuid() != 0:
            return {}
        pw = pwd.getpwnam(RUN_AS)
        return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}

    def init(self) -> None:
        self.root.chmod(0o755)
        self.socket_dir.mkdir()
        self.data.mkdir(mode=0o700)
        if os.geteuid() == 0:
            pw = pwd.getpwnam(RUN_AS)
            for p in (self.socket_dir, self.data):
                os.chown(p, pw.pw_uid, pw.pw_gid)
        subprocess.run(
            [
                str(self.bin_dir / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "--encoding=UTF8",
                "--locale=C",
            ],
            check=True,
            capture_output=True,
            cwd=self.root,
            **self._demote(),  # type: ignore[arg-type]
        )

    def start(self, *, timeout: float = 30.0) -> None:
        log = open(self.root / "postgres.log", "ab")  # noqa: SIM115 - the server keeps it
        self.proc = subprocess.Popen(
            [
                str(self.bin_dir / "postgres"),
                "-D",
                str(self.data),
                "-k",
                str(self.socket_dir),
                "-p",
                str(self.port),
                "-c",
                "listen_addresses=",
                *([] if self.durable else ["-c", "fsync=off", "-c", "synchronous_commit=off"]),
                *([] if self.durable else ["-c", "full_page_writes=off"]),
                "-c",
                "max_connections=300",
                "-c",
                "shared_buffers=32MB",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=self.root,
            **self._demote(),  # type: ignore[arg-type]
        )
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.url(), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("PostgreSQL did not start:\n" + self.log_tail()) from None
                time.sleep(0.05)

    def log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return (self.root / "postgres.log").read_text(errors="replace")[-3000:]
        return ""

    def stop(self, *, timeout: float = 20.0) -> None:
        """Fast shutdown (SIGINT), then SIGKILL of the whole group if it lingers."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        # The server's own children (checkpointer, walwriter...) are in its group.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    def admin(self) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(self.url(), autocommit=True)

    def make_template(self) -> None:
        """A database with the queue's schema applied, which every test database copies."""
        from nymph.queue.pgdb import connect_and_migrate

        with self.admin() as conn:
            conn.execute(f'CREATE DATABASE "{TEMPLATE}"')
        connect_and_migrate(self.url(TEMPLATE))

    def fresh_database(self, *, migrated: bool = True) -> str:
        name = f"t{os.getpid()}_{next(self._counter)}"
        template = TEMPLATE if migrated else "template0"
        with self.admin() as conn:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        return self.url(name)

    def drop_database(self, url: str) -> None:
        """Drop a test's database, with the others done with, once there are ``DROP_BATCH`` of
        them: the first CREATE DATABASE after a DROP takes ten times as long as one after
        another CREATE, so dropping each at once cost every test that. The server's directory
        goes at the end of the run whatever is left."""
        self._done.append(url.split("/", 3)[3].split("?", 1)[0])
        if len(self._done) < DROP_BATCH:
            return
        done, self._done = self._done, []
        with self.admin() as conn:
            for name in done:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def running_server(*, durable: bool = False) -> Iterator[PgServer]:
    """Start a server in a new temp directory; stop it and remove the directory at the end.
    ``durable``: each commit is flushed to disk, as on a production server."""
    bin_dir = find_bin()
    root = Path(tempfile.mkdtemp(prefix="nymph-pg-"))
    server = PgServer(bin_dir=bin_dir, root=root, durable=durable)
    try:
        server.init()
        server.start()
        server.make_template()
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
