"""Which Pods of a watch's batch get a log follower on the direct path: a direct instance's Pod
whose container has started, once, with each followed Pod's latest state kept; never a
daemon-path Pod under the same labels; and whether a Pod is direct is read once per batch."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from nymph.kube.pods import Connection
from nymph.queue.db import Database
from nymph.queue.direct.podlogs import DirectLogs
from nymph.queue.models import QueueSettings
from nymph.queue.store import Store

CONN = Connection(namespace="jobs")


def _pod(name: str, *, started: bool, phase: str = "Running") -> dict[str, Any]:
    state: dict[str, Any] = {"running": {"startedAt": "2026-12-07T00:00:00Z"}} if started else {"waiting": {}}
    return {
        "metadata": {"name": name, "namespace": "jobs"},
        "spec": {"nodeName": "node-1"},
        "status": {"phase": phase, "containerStatuses": [{"name": "user", "state": state}]},
    }


class Held(DirectLogs):
    """The followers' bookkeeping as it is, with each follower's work held until released (what
    it does with a log is the log follower's own tests' concern)."""

    def __init__(self, store: Store) -> None:
        super().__init__(store=store, connector=None)  # type: ignore[arg-type]
        self.release = asyncio.Event()
        self.started: list[str] = []

    async def _run(self, ns: str, conn: Connection, name: str, node: str) -> None:
        self.started.append(name)
        await self.release.wait()


class CountingDb:
    def __init__(self, db: Database) -> None:
        self._db = db
        self.reads = 0

    async def read_one(self, fn: Callable[[Any], Any]) -> Any:
        self.reads += 1
        return await self._db.read_one(fn)

    async def read(self, fn: Callable[[Any], Any]) -> Any:
        self.reads += 1
        return await self._db.read(fn)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[tuple[Store, CountingDb]]:
    db = Database(path=tmp_path / "q.db")
    await db.open()
    counting = CountingDb(db)
    st = Store(db=db, settings=QueueSettings())
    st.direct.db = counting  # type: ignore[assignment]

    def seed(conn: Any) -> None:
        for iid, dispatch in (("i-direct-1", "direct"), ("i-direct-2", "direct"), ("i-daemon", "daemon")):
            conn.execute(
                "INSERT INTO instances (instance_id, namespace, provider, kube_namespace, state, reason, "
                "message, node, launched_at, updated_at, version, requester, dispatch) "
                "VALUES (?, 'team-a', 'p', 'jobs', 'running', NULL, '', NULL, 1, 1, 1, 'u', ?)",
                (iid, dispatch),
            )

    await db.write(seed)
    try:
        yield st, counting
    finally:
        await db.close()


async def test_a_batch_starts_followers_for_its_started_direct_pods_with_one_read(
    store: tuple[Store, CountingDb],
) -> None:
    st, db = store
    logs = Held(st)
    changes = [
        ("MODIFIED", _pod("i-direct-1", started=True)),
        ("MODIFIED", _pod("i-direct-2", started=False)),  # not started yet: no follower
        ("MODIFIED", _pod("i-daemon", started=True)),  # a daemon's Pod: its daemon follows it
        ("MODIFIED", _pod("i-unknown", started=True)),  # no record at all
        ("MODIFIED", _pod("i-direct-1", started=True, phase="Succeeded")),  # the same Pod, later
    ]
    await logs.on_pods(ns="team-a", conn=CONN, changes=changes)
    await asyncio.sleep(0)
    assert logs.started == ["i-direct-1"]
    assert db.reads == 1
    assert logs.busy("i-direct-1") and not logs.busy("i-daemon") and not logs.busy("i-direct-2")
    assert logs.pods["i-direct-1"] is changes[-1][1]  # its latest state, for "has it ended"
    # The next batch: the followed Pod is not read again, the one that started now is.
    await logs.on_pods(
        ns="team-a",
        conn=CONN,
        changes=[
            ("MODIFIED", _pod("i-direct-1", started=True)),
            ("MODIFIED", _pod("i-direct-2", started=True)),
        ],
    )
    await asyncio.sleep(0)
    assert logs.started == ["i-direct-1", "i-direct-2"] and db.reads == 2
    # A batch of followed Pods only, or of Pods not started, reads nothing.
    await logs.on_pods(ns="team-a", conn=CONN, changes=[("DELETED", _pod("i-direct-1", started=True))])
    await logs.on_pods(ns="team-a", conn=CONN, changes=[("ADDED", _pod("i-other", started=False))])
    assert db.reads == 2
    assert logs.pods["i-direct-1"] is None  # deleted: the follower sees it has ended
    logs.release.set()
    await logs.close()


async def test_a_pod_started_and_deleted_in_one_batch_is_followed_and_seen_gone(
    store: tuple[Store, CountingDb],
) -> None:
    st, _ = store
    logs = Held(st)
    await logs.on_pods(
        ns="team-a",
        conn=CONN,
        changes=[
            ("MODIFIED", _pod("i-direct-1", started=True)),
            ("DELETED", _pod("i-direct-1", started=True)),
        ],
    )
    await asyncio.sleep(0)
    assert logs.started == ["i-direct-1"] and logs.pods["i-direct-1"] is None
    logs.release.set()
    await logs.close()
    assert not logs.busy("i-direct-1")
