"""Launch groups over real HTTP (daemon path, SQLite and PostgreSQL): bulk accept, per-member
env and label, validation as a whole, idempotency, counts, paged members, and the group stop."""

from __future__ import annotations

from typing import Any

import pytest

from nymph.launch.render import render_pod
from nymph.launch.spec import LaunchSpec
from nymph.queue.sql import groups as groups_sql
from nymph.queue.sql.dialect import PgConn
from tests.support.queue_helpers import Queue

NS = "/v1/namespaces/default"
LAUNCHES = NS + "/providers/kind/launches"
INSTANCES = NS + "/providers/kind/instances"


async def _instances(q: Queue) -> list[dict[str, object]]:
    r = await q.call("GET", INSTANCES + "?limit=500")
    assert r.status == 200, r.body
    return list(r.body["items"])


async def test_a_counted_group_queues_every_launch_with_its_group_env_and_label(kind: Queue) -> None:
    """Each member's Pod carries NYMPH_GROUP_ID, its 0-based NYMPH_GROUP_INDEX and the group
    label; a tag on the group label's key is dropped, never sent to the API server."""
    body = {
        "mode": "small",
        "script": "print(1)",
        "count": 3,
        "tags": {"nymph.io/group": "mine", "team": "ml"},
    }
    r = await kind.call("POST", LAUNCHES, json_body=body)
    assert r.status == 202, r.body
    gid = r.body["groupId"]
    assert gid.startswith("group-") and r.body["total"] == 3 and r.body["providerName"] == "kind"
    ids = [i["instanceId"] for i in r.body["instances"]]
    assert len(set(ids)) == 3 and {i["state"] for i in r.body["instances"]} == {"queued"}

    tasks = await kind.daemon().claim(daemon_id="d1", node="n1", capacity=10, wait=0)
    by_id = {t["instanceId"]: t for t in tasks}
    assert set(by_id) == set(ids)
    for index, iid in enumerate(ids):
        pod = render_pod(LaunchSpec.from_json(by_id[iid]["spec"]), node="n1", workdir_root="/var/lib/nymph")
        env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
        assert env["NYMPH_GROUP_ID"] == gid and env["NYMPH_GROUP_INDEX"] == str(index)
        assert pod["metadata"]["labels"]["nymph.io/group"] == gid
        assert pod["metadata"]["labels"]["team"] == "ml"
    inst = (await kind.call("GET", f"{INSTANCES}/{ids[2]}")).body
    assert inst["groupId"] == gid and inst["groupIndex"] == 2


async def test_items_merge_over_the_group_and_a_bad_item_refuses_the_whole_group(kind: Queue) -> None:
    """An item's env merges over the group's; one invalid item is a 400 naming it, and nothing of
    the group is queued."""
    bad = {
        "mode": "small",
        "script": "print(1)",
        "env": {"A": "1", "B": "2"},
        "items": [{"env": {"B": "x"}}, {"tags": {"bad key!": "v"}}],
    }
    r = await kind.call("POST", LAUNCHES, json_body=bad)
    assert r.status == 400 and "items[1]" in r.body["detail"] and "tags.bad key!" in r.body["detail"], r.body
    for wrong, needle in (
        ({"mode": "small", "script": "x", "count": 10_001}, "count"),
        ({"mode": "small", "script": "x", "count": 2, "items": [{}]}, "count"),
        ({"script": "x", "count": 2}, "mode"),
        ({"mode": "small", "script": "x", "items": [{"colour": 1}]}, "items[0].colour"),
        ({"mode": "ghost", "script": "x", "count": 2}, "ghost"),
    ):
        r = await kind.call("POST", LAUNCHES, json_body=wrong)
        assert r.status in (400, 404) and needle in r.body["detail"], (wrong, r.body)
    assert await _instances(kind) == []

    good = {**bad, "items": [{"env": {"B": "x"}}, {"env": {"C": "3"}, "script": "print(2)"}]}
    r = await kind.call("POST", LAUNCHES, json_body=good)
    assert r.status == 202, r.body
    tasks = await kind.daemon().claim(daemon_id="d1", node="n1", capacity=10, wait=0)
    specs = sorted((LaunchSpec.from_json(t["spec"]) for t in tasks), key=lambda s: s.group_index or 0)
    assert [dict(s.env) for s in specs] == [{"A": "1", "B": "x"}, {"A": "1", "B": "2", "C": "3"}]
    assert [s.script for s in specs] == ["print(1)", "print(2)"]


async def test_an_idempotency_key_makes_the_whole_group_idempotent(kind: Queue) -> None:
    """The same key and body answer the first 202 again and queue nothing more; the same key with
    another body is a 409."""
    body = {"mode": "small", "script": "print(1)", "count": 4}
    key = {"Idempotency-Key": "group-key-1"}
    first = await kind.call("POST", LAUNCHES, json_body=body, headers=key)
    again = await kind.call("POST", LAUNCHES, json_body=body, headers=key)
    assert first.status == again.status == 202 and first.body == again.body
    assert len(await _instances(kind)) == 4
    other = await kind.call("POST", LAUNCHES, json_body={**body, "count": 5}, headers=key)
    assert other.status == 409 and other.body["error"] == "idempotency_key_reused"
    assert len(await _instances(kind)) == 4


async def test_group_counts_pages_and_an_idempotent_stop(kind: Queue) -> None:
    """The group answers its counts by state; its members page by place; its stop ends queued
    members at once and orders a running one's stop after its launch; a second stop is 204
    again and changes nothing."""
    r = await kind.call("POST", LAUNCHES, json_body={"mode": "small", "script": "print(1)", "count": 5})
    gid, ids = r.body["groupId"], [i["instanceId"] for i in r.body["instances"]]
    group = NS + f"/groups/{gid}"
    got = (await kind.call("GET", group)).body
    assert got["total"] == 5 and got["counts"] == {"queued": 5} and got["reasons"] == {}

    page = (await kind.call("GET", group + "/instances?limit=2")).body
    seen = [i["instanceId"] for i in page["items"]]
    while "continue" in page:
        page = (await kind.call("GET", group + f"/instances?limit=2&continue={page['continue']}")).body
        seen += [i["instanceId"] for i in page["items"]]
    assert seen == ids

    daemon = kind.daemon()
    [leased] = await daemon.claim(daemon_id="d1", node="n1", capacity=1, wait=0)
    assert (await kind.call("DELETE", group)).status == 204
    got = (await kind.call("GET", group)).body
    assert got["counts"] == {"stopped": 4, "stopping": 1} and got["reasons"] == {"Stopped": 4}
    assert "stopRequestedAt" in got
    assert (await kind.call("DELETE", group)).status == 204
    assert (await kind.call("GET", group)).body["counts"] == {"stopped": 4, "stopping": 1}
    # the launch being applied finishes, then its stop is handed out (no Pod is left behind)
    done = await daemon.complete(daemon_id="d1", task_id=leased["taskId"], ok=True)
    assert done["status"] == "done"
    [stop] = await daemon.claim(daemon_id="d1", node="n1", capacity=5, wait=0)
    assert stop["kind"] == "stop" and stop["instanceId"] == leased["instanceId"]
    assert (await kind.call("GET", NS + "/groups/group-000000000000")).status == 404


_STATEMENTS = ("execute", "executemany", "send")


class _Statements:
    """A connection that counts the statements it is given (one ``executemany`` over many rows
    is one statement); everything else is the connection's own."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.count = 0
        self._own = {name: getattr(conn, name, None) for name in _STATEMENTS}

    def _call(self, name: str, args: tuple[Any, ...]) -> Any:
        self.count += 1
        method = self._own[name]
        assert method is not None, f"the connection has no {name}"
        return method(*args)

    def execute(self, *args: Any) -> Any:
        return self._call("execute", args)

    def executemany(self, *args: Any) -> Any:
        return self._call("executemany", args)

    def send(self, *args: Any) -> Any:
        return self._call("send", args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


def _count_group_statements(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Per run of the group's accept (a PostgreSQL write may run again from its start), the
    statements it issued."""
    runs: list[int] = []
    accept = groups_sql.accept_group

    def counted(conn: Any, **kwargs: Any) -> Any:
        counter = _Statements(conn)
        if not isinstance(conn, PgConn):
            try:
                return accept(counter, **kwargs)
            finally:
                runs.append(counter.count)
        # the dialect is told by the connection's class: count on the connection itself
        for name in _STATEMENTS:
            setattr(conn, name, getattr(counter, name))
        try:
            return accept(conn, **kwargs)
        finally:
            for name in _STATEMENTS:
                delattr(conn, name)
            runs.append(counter.count)

    monkeypatch.setattr(groups_sql, "accept_group", counted)
    return runs


async def test_a_thousand_launch_group_goes_in_as_bulk_statements_of_one_transaction(
    kind: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group's POST is one write transaction of bulk statements: 1,000 launches issue no more
    than 10 do, but for the id look-ups taken 500 ids at a time (one by one, they would be
    thousands). How long it takes is measured by benchmarks/group_bench.py."""
    body = {"mode": "small", "script": "print(1)"}
    runs = _count_group_statements(monkeypatch)
    seen: dict[int, int] = {}
    for size in (10, 1000):
        r = await kind.call("POST", LAUNCHES, json_body={**body, "count": size})
        assert r.status == 202 and r.body["total"] == size
        assert runs, "the group's accept did not run"
        seen[size] = runs[-1]
        runs.clear()
    assert 0 < seen[10] <= seen[1000] <= seen[10] + 1, seen
    got = (await kind.call("GET", NS + f"/groups/{r.body['groupId']}")).body
    assert got["total"] == 1000 and got["counts"] == {"queued": 1000}
