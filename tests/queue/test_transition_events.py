"""The event a state change writes is the instance as that change left it: the transition builds
it from what it read and wrote instead of reading the row back, so each event must equal a
read of the row at that moment, through every kind of change (state, reason, message, node,
waiting, an exit code kept before, a group and a later attempt)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from nymph.queue import db
from nymph.queue.sql.transitions import record_termination, transition

SNAPSHOT = "namespace, provider, group_id, attempt, state, reason, message, exit_code, node, waiting"


@pytest.fixture
def conn(tmp_path: Path) -> sqlite3.Connection:
    c = db.connect(tmp_path / "q.db")
    c.execute(
        "INSERT INTO instances (instance_id, namespace, provider, kube_namespace, state, launched_at, "
        "updated_at, version, requester, group_id, attempt, waiting) "
        "VALUES ('i-1', 'team-a', 'kind', 'jobs', 'queued', 1, 1, 1, 'r', 'g-1', 2, ?)",
        ('{"kind": "quota", "message": "waiting for the quota"}',),
    )
    return c


def _last_event(c: sqlite3.Connection) -> dict[str, Any]:
    row = c.execute(
        "SELECT namespace, provider, launch_group AS group_id, attempt, state, reason, message, exit_code, "
        "node, waiting, waiting_kind FROM events ORDER BY seq DESC LIMIT 1"
    ).fetchone()
    return dict(row)


def _read_back(c: sqlite3.Connection) -> dict[str, Any]:
    row = dict(c.execute(f"SELECT {SNAPSHOT} FROM instances WHERE instance_id = 'i-1'").fetchone())
    row["message"] = row["message"] or ""
    if row["state"] != "queued":
        row["waiting"] = None
    return row


STEPS: list[dict[str, Any]] = [
    {"reason": "Held", "message": "held back"},
    {"state": "queued", "node": "n1", "message": "claimed"},
    {"state": "starting", "message": "Pod applied"},
    {"state": "running", "reason": None, "message": None},
    {"exit": (3, "Error", "it failed")},
    {"state": "stopped", "reason": "Failed", "message": "exit code 3", "node": "n2"},
]


def test_each_event_of_a_transition_is_the_row_as_it_left_it(conn: sqlite3.Connection) -> None:
    seen = 0
    for ts, step in enumerate(STEPS, start=2):
        if "exit" in step:
            assert record_termination(conn, instance_id="i-1", termination=step["exit"])
        else:
            args = {k: v for k, v in step.items() if k != "reason"}
            if "reason" in step:
                args["reason"] = step["reason"]
            assert transition(conn, instance_id="i-1", now=float(ts), **args)
        count = conn.execute("SELECT COUNT(*) FROM events").fetchone()[0]
        assert count == seen + 1, f"one event per change: {step}"
        seen = count
        event = _last_event(conn)
        kind = event.pop("waiting_kind")
        assert event == _read_back(conn), f"after {step}"
        assert (kind is None) == (event["waiting"] is None)
    assert _last_event(conn)["exit_code"] == 3
    first = conn.execute("SELECT waiting, waiting_kind FROM events ORDER BY seq LIMIT 1").fetchone()
    assert first["waiting"] is not None and first["waiting_kind"] is not None
