"""The SQLite database holds launch scripts, env values and token hashes: it and its -wal and
-shm files are 0600 whoever creates them (``nymph queue token create`` or ``nymph queue serve``,
real processes, under the usual 022 umask), and a file made readable to others before is
tightened when the queue opens it, with a log line."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nymph.client import QueueClient

WAL, SHM = "-wal", "-shm"


def _nymph(*args: str) -> list[str]:
    return [sys.executable, "-m", "nymph.cli", *args]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _side(db: Path, suffix: str) -> Path:
    return db.with_name(db.name + suffix)


@contextlib.contextmanager
def _umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def _token_create(db: Path) -> subprocess.CompletedProcess[str]:
    with _umask(0o022):
        return subprocess.run(
            _nymph("queue", "token", "create", "--db", str(db), "--role", "user"),
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        )


@contextlib.contextmanager
def _serving(db: Path, log: Path) -> Iterator[str]:
    with _umask(0o022), log.open("a") as err:
        proc = subprocess.Popen(
            _nymph("queue", "serve", "--db", str(db), "--listen", "127.0.0.1:0"),
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "serving on http://" in line, log.read_text()[-2000:]
        yield line.split("serving on ", 1)[1].split()[0]
    finally:
        proc.kill()
        proc.wait(30)


async def _use(url: str, token: str) -> None:
    """A write through the running queue (its WAL and shared-memory files are in use)."""
    async with QueueClient(base_url=url, token=token) as user:
        await user.create_provider(name="kind", kwargs={"namespace": "jobs"}, dispatch="daemon")


async def test_token_create_makes_a_private_database_and_serve_keeps_its_wal_private(tmp_path: Path) -> None:
    db = tmp_path / "queue.db"
    token = _token_create(db).stdout.split()[-1]
    assert _mode(db) == 0o600
    with _serving(db, tmp_path / "serve.log") as url:
        await _use(url, token)
        assert _side(db, WAL).exists() and _side(db, SHM).exists()
        assert {p.name: _mode(p) for p in (db, _side(db, WAL), _side(db, SHM))} == {
            "queue.db": 0o600,
            "queue.db-wal": 0o600,
            "queue.db-shm": 0o600,
        }


async def test_serve_makes_a_private_database(tmp_path: Path) -> None:
    db = tmp_path / "data" / "queue.db"
    with _serving(db, tmp_path / "serve.log"):
        assert _mode(db) == 0o600
        for suffix in (WAL, SHM):
            assert _mode(_side(db, suffix)) == 0o600, suffix
    token = _token_create(db).stdout.split()[-1]
    assert token and _mode(db) == 0o600


def _readable_database(db: Path) -> sqlite3.Connection:
    """A database an older nymph left 0644, with its -wal and -shm files (0644 too) held open by
    a connection that has not checkpointed."""
    with _umask(0o022):
        conn = sqlite3.connect(str(db), isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA wal_autocheckpoint=0")
        conn.execute("CREATE TABLE old_rows (x TEXT)")
        conn.execute("INSERT INTO old_rows VALUES ('kept')")
    for p in (db, _side(db, WAL), _side(db, SHM)):
        os.chmod(p, 0o644)
    return conn


def _records(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict):
                out.append(record)
    return out


@pytest.mark.parametrize("opener", ["token create", "serve"])
async def test_a_readable_database_is_tightened_at_start(tmp_path: Path, opener: str) -> None:
    db = tmp_path / "queue.db"
    held = _readable_database(db)
    try:
        if opener == "token create":
            run = _token_create(db)
            said = run.stdout + run.stderr
        else:
            log = tmp_path / "serve.log"
            with _serving(db, log):
                pass
            said = log.read_text()
        assert {p.name: _mode(p) for p in (db, _side(db, WAL), _side(db, SHM))} == {
            "queue.db": 0o600,
            "queue.db-wal": 0o600,
            "queue.db-shm": 0o600,
        }
        tightened = {
            Path(r["path"]).name: r["was"]
            for r in _records(said)
            if "tightened to 0600" in r.get("event", "")
        }
        assert tightened == {"queue.db": "0644", "queue.db-wal": "0644", "queue.db-shm": "0644"}, said[-3000:]
        assert held.execute("SELECT x FROM old_rows").fetchall() == [("kept",)]
    finally:
        held.close()
