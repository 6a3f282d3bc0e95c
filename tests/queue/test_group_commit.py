"""SQLite group commit: writes queued together share one commit, each caller gets its own
result or error (a failed write rolls back alone), and nothing is answered before it is
committed."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from nymph.queue.db import Database


class Refused(Exception):
    pass


async def _opened(tmp_path: Path) -> Database:
    db = Database(path=tmp_path / "q.db")
    await db.open()
    await db.write(lambda c: c.execute("CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY, v TEXT)"))
    return db


async def test_concurrent_writes_share_commits_and_each_gets_its_own_result(tmp_path: Path) -> None:
    db = await _opened(tmp_path)
    try:
        before_commits, before_writes = db.commits, db.grouped_writes

        def insert(k: int) -> int:
            def fn(c: sqlite3.Connection) -> int:
                if k % 7 == 3:
                    c.execute("INSERT INTO t VALUES (?, ?)", (k, "rolled back"))
                    raise Refused(f"write {k} refused")
                c.execute("INSERT INTO t VALUES (?, ?)", (k, f"v{k}"))
                return k * 10

            return fn

        outcomes = await asyncio.gather(*(db.write(insert(k)) for k in range(200)), return_exceptions=True)
        for k, out in enumerate(outcomes):
            if k % 7 == 3:
                assert isinstance(out, Refused) and str(out) == f"write {k} refused"
            else:
                assert out == k * 10
        assert db.grouped_writes - before_writes == 200
        assert db.commits - before_commits < 200 / 4  # grouped: far fewer commits than writes
        rows = await db.read(lambda c: c.execute("SELECT k, v FROM t ORDER BY k").fetchall())
        assert [tuple(r) for r in rows] == [(k, f"v{k}") for k in range(200) if k % 7 != 3]
    finally:
        await db.close()


async def test_what_was_answered_is_on_disk_for_the_next_process(tmp_path: Path) -> None:
    db = await _opened(tmp_path)
    answered = await asyncio.gather(
        *(
            db.write(lambda c, k=k: c.execute("INSERT INTO t VALUES (?, 'x')", (k,)).rowcount)
            for k in range(50)
        )
    )
    assert answered == [1] * 50
    other = sqlite3.connect(tmp_path / "q.db")  # another connection sees every answered write
    try:
        assert other.execute("SELECT COUNT(*) FROM t").fetchone()[0] == 50
    finally:
        other.close()
        await db.close()


async def test_a_failed_commit_fails_every_write_of_its_group(tmp_path: Path) -> None:
    db = await _opened(tmp_path)
    blocker = sqlite3.connect(tmp_path / "q.db", timeout=0.1)
    try:
        blocker.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        await db.read(lambda c: c.execute("PRAGMA busy_timeout=100"))  # on the database's thread
        results = await asyncio.gather(
            *(db.write(lambda c, k=k: c.execute("INSERT INTO t VALUES (?, 'x')", (k,))) for k in range(5)),
            return_exceptions=True,
        )
        assert all(isinstance(r, sqlite3.OperationalError) for r in results)
        blocker.rollback()
        await db.write(lambda c: c.execute("INSERT INTO t VALUES (99, 'after')"))
        rows = await db.read(lambda c: c.execute("SELECT k FROM t").fetchall())
        assert [r[0] for r in rows] == [99]
    finally:
        blocker.close()
        await db.close()


async def test_a_closed_database_refuses_writes_clearly(tmp_path: Path) -> None:
    db = await _opened(tmp_path)
    await db.close()
    with pytest.raises(Exception, match="not open"):
        await db.write(lambda c: c.execute("SELECT 1"))


async def test_a_write_alone_runs_without_a_savepoint_and_rolls_back_whole(tmp_path: Path) -> None:
    """A write with no other queued beside it is its transaction: no savepoint statements, and
    when it fails, nothing it wrote stays and the next write starts clean."""
    db = await _opened(tmp_path)
    statements: list[str] = []
    try:
        await db.read(lambda c: c.set_trace_callback(statements.append))

        def refused(c: sqlite3.Connection) -> None:
            c.execute("INSERT INTO t VALUES (1, 'rolled back')")
            raise Refused("no")

        with pytest.raises(Refused):
            await db.write(refused)
        assert await db.write(lambda c: c.execute("INSERT INTO t VALUES (2, 'kept')").rowcount) == 1
        rows = await db.read(lambda c: c.execute("SELECT k, v FROM t").fetchall())
        assert [tuple(r) for r in rows] == [(2, "kept")]
        assert not [s for s in statements if "SAVEPOINT" in s or "RELEASE" in s]
        assert statements.count("ROLLBACK") == 1
    finally:
        await db.read(lambda c: c.set_trace_callback(None))
        await db.close()
