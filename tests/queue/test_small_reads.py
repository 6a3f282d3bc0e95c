"""SQLite small reads on the event loop: they see every write answered before them, cannot
write, and one that finds the file busy (another process holding it) runs again on the
database thread, where waiting does not stall the loop."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from nymph.queue.db import Database


async def _opened(tmp_path: Path) -> Database:
    db = Database(path=tmp_path / "q.db")
    await db.open()
    await db.write(lambda c: c.execute("CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY, v TEXT)"))
    return db


def _value(k: int) -> object:
    def read(c: sqlite3.Connection) -> object:
        row = c.execute("SELECT v FROM t WHERE k = ?", (k,)).fetchone()
        return None if row is None else row["v"]

    return read


async def test_a_small_read_sees_each_write_answered_before_it(tmp_path: Path) -> None:
    db = await _opened(tmp_path)
    try:
        for k in range(50):
            await db.write(lambda c, k=k: c.execute("INSERT INTO t VALUES (?, ?)", (k, f"v{k}")))
            assert await db.read_small(_value(k)) == f"v{k}"
        await db.write(lambda c: c.execute("UPDATE t SET v = 'changed' WHERE k = 7"))
        assert await db.read_small(_value(7)) == "changed"
        assert await db.read_small(_value(99)) is None
    finally:
        await db.close()


async def test_a_database_path_with_uri_characters_opens_and_reads(tmp_path: Path) -> None:
    odd = tmp_path / "a dir %41" / "q #1?mode=rw.db"
    db = Database(path=odd)
    await db.open()
    try:
        await db.write(lambda c: c.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)"))
        await db.write(lambda c: c.execute("INSERT INTO t VALUES (1, 'odd')"))
        assert await db.read_small(_value(1)) == "odd"
        assert sorted(p.name for p in odd.parent.iterdir() if not p.name.endswith(("-wal", "-shm"))) == [
            odd.name
        ]
    finally:
        await db.close()


async def test_a_small_read_cannot_write(tmp_path: Path) -> None:
    db = await _opened(tmp_path)
    try:
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            await db.read_small(lambda c: c.execute("INSERT INTO t VALUES (1, 'x')"))
        assert await db.read(lambda c: c.execute("SELECT COUNT(*) FROM t").fetchone()[0]) == 0
    finally:
        await db.close()


async def test_a_read_that_finds_the_file_busy_runs_again_on_the_database_thread(tmp_path: Path) -> None:
    db = await _opened(tmp_path)
    try:
        await db.write(lambda c: c.execute("INSERT INTO t VALUES (1, 'one')"))
        ran_on: list[str] = []

        def read(c: sqlite3.Connection) -> object:
            ran_on.append(threading.current_thread().name)
            if threading.current_thread() is threading.main_thread():
                # what SQLite answers a reader while another process holds the file exclusively
                raise sqlite3.OperationalError("database is locked")
            return _value(1)(c)

        assert await db.read_small(read) == "one"
        assert ran_on[0] == threading.main_thread().name and ran_on[1].startswith("nymph-queue-db")
        ran_on.clear()

        def broken(c: sqlite3.Connection) -> object:
            ran_on.append(threading.current_thread().name)
            return c.execute("SELECT v FROM missing_table").fetchone()

        with pytest.raises(sqlite3.OperationalError, match="no such table"):
            await db.read_small(broken)  # any other error is the caller's, raised at once
        assert len(ran_on) == 1
    finally:
        await db.close()
