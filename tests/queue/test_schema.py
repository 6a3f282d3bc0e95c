"""Schema migrations: a database file written by an older nymph opens, keeps every row and
index, and gains what the newer schema adds."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from nymph.queue.db import DatabaseError, connect
from nymph.queue.sql.migrations import MIGRATIONS
from tests.support.queue_helpers import FAST, open_queue

NS = "/v1/namespaces/default"


def _version_1_file(path: Path) -> None:
    """A queue file as nymph with schema version 1 left it: a provider, a stopped-on-request
    launch whose stop task waits on it, and a pending launch with an Idempotency-Key."""
    conn = sqlite3.connect(str(path), isolation_level=None)
    conn.execute("PRAGMA foreign_keys=ON")
    conn.executescript(f"BEGIN;\n{MIGRATIONS[0]}\nPRAGMA user_version = 1;\nCOMMIT;")
    conn.executescript(
        """
        BEGIN;
        INSERT INTO providers VALUES ('default', 'kind',
            '{"name": "kind", "launcher": "Kube", "dispatch": "daemon", "kwargs": {"namespace": "jobs"}}',
            1, 1);
        INSERT INTO instances (instance_id, namespace, provider, kube_namespace, state, message,
            node, launched_at, updated_at, version, requester, stop_requested_at)
            VALUES ('lakeshore-0000000a', 'default', 'kind', 'jobs', 'stopping', 'stop requested',
                    'n1', 1, 3, 3, 'alice (tok-1)', 3),
                   ('lakeshore-0000000b', 'default', 'kind', 'jobs', 'queued', '',
                    NULL, 4, 4, 1, 'alice (tok-1)', NULL);
        INSERT INTO instance_events (instance_id, state, message, at)
            VALUES ('lakeshore-0000000a', 'queued', '', 1),
                   ('lakeshore-0000000a', 'running', '', 2),
                   ('lakeshore-0000000a', 'stopping', 'stop requested', 3),
                   ('lakeshore-0000000b', 'queued', '', 4);
        INSERT INTO tasks (seq, task_id, kind, status, namespace, kube_namespace, provider,
            instance_id, spec, requester, attempts, lease_owner, after_task, created_at,
            updated_at, finished_at)
            VALUES (1, 'task-launch-a', 'launch', 'done', 'default', 'jobs', 'kind',
                    'lakeshore-0000000a', '{"x": 1}', 'alice (tok-1)', 1, 'd1', NULL, 1, 2, 2),
                   (2, 'task-stop-a', 'stop', 'pending', 'default', 'jobs', 'kind',
                    'lakeshore-0000000a', NULL, 'alice (tok-1)', 0, NULL, 'task-launch-a', 3, 3,
                    NULL),
                   (7, 'task-launch-b', 'launch', 'pending', 'default', 'jobs', 'kind',
                    'lakeshore-0000000b', '{"y": 2}', 'alice (tok-1)', 0, NULL, NULL, 4, 4, NULL);
        INSERT INTO idempotency_keys VALUES ('default', 'kind', 'k-1', 'abc', 'lakeshore-0000000b',
            '{"instanceId": "lakeshore-0000000b"}', 4);
        COMMIT;
        """
    )
    conn.close()


def _schema(conn: sqlite3.Connection) -> dict[str, str]:
    return {
        r[0]: r[1]
        for r in conn.execute(
            "SELECT name, tbl_name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"
        )
    }


def test_a_version_1_file_migrates_keeping_rows_and_indexes(tmp_path: Path) -> None:
    path = tmp_path / "queue.db"
    _version_1_file(path)
    before = sqlite3.connect(str(path))
    cur = before.execute("SELECT * FROM tasks ORDER BY seq")
    old_rows = cur.fetchall()
    old_columns = ", ".join(d[0] for d in cur.description)
    old_indexes = _schema(before)
    before.close()

    conn = connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
        assert [tuple(r) for r in conn.execute(f"SELECT {old_columns} FROM tasks ORDER BY seq")] == [
            tuple(r) for r in old_rows
        ]
        # An instance applied before is bound to the daemon that completed its launch, on the
        # node its Pod runs on; one never applied to nobody.
        bound = conn.execute(
            "SELECT instance_id, applied_daemon, applied_node, applied_pinned FROM instances ORDER BY 1"
        ).fetchall()
        assert [tuple(r) for r in bound] == [
            ("lakeshore-0000000a", "d1", "n1", 1),
            ("lakeshore-0000000b", None, None, 0),
        ]
        now = _schema(conn)
        assert old_indexes.items() <= now.items()  # every index kept; later migrations add more
        assert {"instances_page", "instances_page_state", "expired_instances_by_age"} <= set(now)
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("SELECT COUNT(*) FROM instance_events").fetchone()[0] == 4
        # The new kind is accepted; an unknown one and a dangling after_task still are not.
        insert = (
            "INSERT INTO tasks (task_id, kind, status, namespace, kube_namespace, provider, "
            "requester, after_task, created_at, updated_at) VALUES (?, ?, 'pending', 'default', "
            "'jobs', 'kind', 'r', ?, 5, 5)"
        )
        conn.execute(insert, ("task-d", "dockyard", None))
        with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
            conn.execute(insert, ("task-x", "bogus", None))
        with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"):
            conn.execute(insert, ("task-y", "stop", "task-nope"))
        # AUTOINCREMENT carried over: no seq is reused.
        assert conn.execute("SELECT seq FROM tasks WHERE task_id = 'task-d'").fetchone()[0] == 8
    finally:
        conn.close()
    # Opening it again migrates nothing.
    again = connect(path)
    assert again.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    again.close()


async def test_the_migrated_queue_serves_its_old_work(tmp_path: Path) -> None:
    _version_1_file(tmp_path / "queue.db")
    q, runner = await open_queue(tmp_path, FAST)
    try:
        inst = await q.user().get_instance(provider="kind", instance_id="lakeshore-0000000a")
        assert [h["state"] for h in inst["history"]] == ["queued", "running", "stopping"]
        d = q.daemon()
        tasks = await d.claim(daemon_id="d1", node="n1", capacity=5, wait=0)
        assert [(t["taskId"], t["kind"]) for t in tasks] == [
            ("task-stop-a", "stop"),
            ("task-launch-b", "launch"),
        ]
        await d.complete(daemon_id="d1", task_id="task-stop-a", ok=True)
        inst = await q.user().get_instance(provider="kind", instance_id="lakeshore-0000000a")
        assert (inst["state"], inst["reason"]) == ("stopped", "Stopped")
        r = await q.call("GET", f"{NS}/tasks/task-launch-a")
        assert r.status == 200 and r.body["status"] == "done"
    finally:
        await q.close()
        await runner.cleanup()


def test_a_newer_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "queue.db"
    conn = sqlite3.connect(str(path))
    conn.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    conn.close()
    with pytest.raises(DatabaseError, match="upgrade nymph"):
        connect(path)
