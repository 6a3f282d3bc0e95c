"""The queue schedules over real HTTP, on both backends: a backlog no daemon can run never
stalls the launches behind it, namespaces are served in proportion to their weights whatever
their backlogs, priority orders launches inside a namespace, and an admin's quotas hold under
concurrent claims and take effect on the next claim."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from nymph.client import QueueClient
from nymph.protocol import TaskJSON
from nymph.queue.models import Role
from nymph.queue.sql.dialect import Conn
from nymph.queue.sql.schedule import group_of
from tests.support.pg_server import PgServer
from tests.support.queue_helpers import FAST, Queue, add_kind, open_queue

EXAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "examples"
CPU_NODE = {
    "name": "cpu-1",
    "labels": {"pool": "cpu"},
    "taints": [],
    "allocatable": {"cpu": "64", "memory": "256Gi"},
}
GPU_ONLY = {"node_selector": {"pool": "gpu"}}


async def _teams(q: Queue, *teams: str) -> None:
    for team in teams:
        await add_kind(q, namespace=team, kube_ns="jobs")


async def _launch(q: Queue, ns: str, **body: Any) -> str:
    fields = body.pop("fields", {})
    accepted = await q.user(ns).launch(provider="kind", mode="small", script="true", fields=fields, **body)
    return accepted["instanceId"]


async def seed(q: Queue, ns: str, count: int, *, fields: dict[str, Any] | None = None) -> None:
    """``count`` queued launches in ``ns``, written straight into the database (in bulk, so a
    large backlog stays quick), each a copy of one launched through the API."""
    template = await _launch(q, ns, fields=dict(fields or {}))

    def copy(conn: Conn) -> None:
        t = conn.execute("SELECT * FROM tasks WHERE instance_id = ?", (template,)).fetchone()
        spec = json.loads(t["spec"])
        grp = group_of(kind="launch", namespace=ns, kube_namespace=t["kube_namespace"], spec=spec)
        base = time.time() - 3600  # queued an hour ago: older than anything launched next
        for start in range(0, count, 500):
            ids = [f"seed-{ns}-{k:06d}" for k in range(start, min(count, start + 500))]
            conn.execute(
                "INSERT INTO instances (instance_id, namespace, provider, kube_namespace, state, message, "
                "launched_at, updated_at, version, requester) VALUES "
                + ",".join("(?, ?, 'kind', ?, 'queued', '', ?, ?, 1, 'seed')" for _ in ids),
                [v for i in ids for v in (i, ns, t["kube_namespace"], base, base)],
            )
            conn.execute(
                "INSERT INTO tasks (task_id, kind, status, namespace, kube_namespace, provider, instance_id, "
                "spec, requester, created_at, updated_at, grp, priority) VALUES "
                + ",".join("(?, 'launch', 'pending', ?, ?, 'kind', ?, ?, 'seed', ?, ?, ?, 0)" for _ in ids),
                [
                    v
                    for i in ids
                    for v in (
                        f"task-{i}",
                        ns,
                        t["kube_namespace"],
                        i,
                        json.dumps({**spec, "instanceId": i}),
                        base,
                        base,
                        grp,
                    )
                ],
            )

    await q.store.db.write(copy)


_DAEMONS: dict[tuple[str, str], QueueClient] = {}


def _daemon(q: Queue, daemon_id: str) -> QueueClient:
    key = (q.user_token, daemon_id)
    if key not in _DAEMONS:
        _DAEMONS[key] = q.daemon()
    return _DAEMONS[key]


async def _claim(
    q: Queue, daemon_id: str, capacity: int, offer: dict[str, Any] | None = CPU_NODE
) -> list[TaskJSON]:
    return await _daemon(q, daemon_id).claim(
        daemon_id=daemon_id, node=f"node-{daemon_id}", capacity=capacity, wait=0, node_info=offer
    )


async def _admin(q: Queue) -> QueueClient:
    return q.client(await q.token(Role.ADMIN, name="ops"))


async def _put_quota(q: Queue, ns: str, body: dict[str, Any]) -> dict[str, Any]:
    admin = await q.token(Role.ADMIN, name="ops")
    r = await q.call("PUT", f"/v1/namespaces/{ns}/quota", token=admin, json_body=body)
    assert r.status == 200, r.body
    return dict(r.body)


async def test_an_unrunnable_backlog_never_stalls_a_runnable_launch(queue: Queue) -> None:
    await _teams(queue, "team-a", "team-b")
    await seed(queue, "team-a", 3000, fields=GPU_ONLY)  # no live node has pool=gpu
    ordinary = [await _launch(queue, "team-a") for _ in range(5)] + [
        await _launch(queue, "team-b") for _ in range(5)
    ]
    got = await _claim(queue, "d1", capacity=20)
    assert sorted(t["instanceId"] for t in got) == sorted(ordinary)
    assert await _claim(queue, "d1", capacity=20) == []


async def test_a_namespace_with_a_huge_backlog_does_not_delay_a_small_one(queue: Queue) -> None:
    await _teams(queue, "team-a", "team-b")
    await seed(queue, "team-a", 10_000)
    small = {await _launch(queue, "team-b") for _ in range(10)}
    claimed = [t for _ in range(20) for t in await _claim(queue, "d1", capacity=1)]
    by_ns = [t["namespace"] for t in claimed]
    # served in turn (equal weights): the 10 of team-b within the first 20 claims
    assert {t["instanceId"] for t in claimed if t["namespace"] == "team-b"} == small
    assert by_ns.count("team-a") == 10
    assert all(by_ns[i] != by_ns[i + 1] for i in range(19))


async def test_weights_share_the_slots(queue: Queue) -> None:
    await _teams(queue, "team-a", "team-b")
    await _put_quota(queue, "team-a", {"weight": 3})
    await seed(queue, "team-a", 100)
    await seed(queue, "team-b", 100)
    claimed = [t for _ in range(40) for t in await _claim(queue, "d1", capacity=1)]
    counts = {ns: sum(1 for t in claimed if t["namespace"] == ns) for ns in ("team-a", "team-b")}
    assert counts == {"team-a": 30, "team-b": 10}


async def test_priority_orders_launches_inside_a_namespace(queue: Queue) -> None:
    await _teams(queue, "team-a")
    low = await _launch(queue, "team-a", priority=-5)
    plain = await _launch(queue, "team-a")
    high = await _launch(queue, "team-a", priority=10)
    also_high = await _launch(queue, "team-a", fields={"node_selector": {"pool": "cpu"}}, priority=10)
    order = [t["instanceId"] for _ in range(4) for t in await _claim(queue, "d1", capacity=1)]
    assert order == [high, also_high, plain, low]


async def test_max_running_holds_under_concurrent_claims(queue: Queue) -> None:
    await _teams(queue, "team-a", "team-b")
    await _put_quota(queue, "team-a", {"maxRunning": 5})
    await seed(queue, "team-a", 60)
    await seed(queue, "team-b", 8)
    got = await asyncio.gather(*(_claim(queue, f"d{i}", capacity=3) for i in range(20)))
    tasks = [t for batch in got for t in batch]
    assert sum(1 for t in tasks if t["namespace"] == "team-a") == 5
    assert sum(1 for t in tasks if t["namespace"] == "team-b") == 9  # 8 seeded + the template
    assert len({t["taskId"] for t in tasks}) == len(tasks)
    # the quota says what it holds, to the namespace's own users
    r = await queue.call("GET", "/v1/namespaces/team-a/quota")
    assert r.status == 200 and r.body["usage"]["running"] == 5 and r.body["maxRunning"] == 5
    # raised, it takes effect on the next claim; lowering it stops nothing
    await _put_quota(queue, "team-a", {"maxRunning": 8})
    assert len(await _claim(queue, "d1", capacity=10)) == 3
    await _put_quota(queue, "team-a", {"maxRunning": 2})
    assert await _claim(queue, "d1", capacity=10) == []
    r = await queue.call("GET", "/v1/namespaces/team-a/quota")
    assert r.body["usage"]["running"] == 8


async def test_a_resource_quota_holds_under_concurrent_claims(queue: Queue) -> None:
    await _teams(queue, "team-a")
    await _put_quota(queue, "team-a", {"resources": {"cpu": "2"}})
    await seed(queue, "team-a", 30, fields={"resources": {"requests": {"cpu": "500m"}}})
    got = await asyncio.gather(*(_claim(queue, f"d{i}", capacity=2) for i in range(20)))
    assert sum(len(b) for b in got) == 4
    r = await queue.call("GET", "/v1/namespaces/team-a/quota")
    assert r.body["usage"] == {"running": 4, "resources": {"cpu": "2"}}


async def test_a_stopped_launch_frees_its_place_in_the_quota(queue: Queue) -> None:
    await _teams(queue, "team-a")
    await _put_quota(queue, "team-a", {"maxRunning": 1})
    first = await _launch(queue, "team-a")
    second = await _launch(queue, "team-a")
    [task] = await _claim(queue, "d1", capacity=5)
    assert task["instanceId"] == first
    assert await _claim(queue, "d1", capacity=5) == []
    d = _daemon(queue, "d1")
    await d.complete(daemon_id="d1", task_id=task["taskId"], ok=False, error="image missing")
    got = await _claim(queue, "d1", capacity=5)
    assert [t["instanceId"] for t in got] == [second]


async def test_quota_routes_take_an_admin_token(queue: Queue) -> None:
    r = await queue.call("PUT", "/v1/namespaces/team-a/quota", json_body={"maxRunning": 3})
    assert r.status == 403 and r.body["error"] == "admin_required"
    assert "--role admin" in r.body["detail"]
    r = await queue.call("GET", "/v1/quotas")
    assert r.status == 403
    scoped = await queue.token(Role.USER, namespace="team-b")
    r = await queue.call("GET", "/v1/namespaces/team-a/quota", token=scoped)
    assert r.status == 403 and r.body["error"] == "wrong_namespace"
    admin = await queue.token(Role.ADMIN)
    r = await queue.call("PUT", "/v1/namespaces/team-a/quota", token=admin, json_body={"maxRunning": "3"})
    assert r.status == 400 and "quota.maxRunning" in r.body["detail"]
    r = await queue.call(
        "PUT", "/v1/namespaces/team-a/quota", token=admin, json_body={"weight": 2, "maxRuntime": "2h"}
    )
    assert r.status == 200 and r.body["weight"] == 2 and r.body["maxRuntime"] == 7200
    r = await queue.call("GET", "/v1/quotas", token=admin)
    assert r.status == 200 and [q["namespace"] for q in r.body["items"]] == ["team-a"]
    # an admin token may use the user routes of any namespace
    r = await queue.call("GET", "/v1/namespaces/team-c/providers", token=admin)
    assert r.status == 200


async def test_runtime_limits_of_a_namespace(queue: Queue) -> None:
    await _teams(queue, "team-a")
    await _put_quota(queue, "team-a", {"maxRuntime": "2h", "defaultRuntime": "30m"})
    named = await _launch(queue, "team-a", fields={"max_runtime": "1h"})
    unnamed = await _launch(queue, "team-a")
    r = await queue.call(
        "POST",
        "/v1/namespaces/team-a/providers/kind/launch",
        json_body={"mode": "small", "script": "true", "fields": {"max_runtime": "3h"}},
    )
    assert r.status == 400 and "maxRuntime 2h" in r.body["detail"]
    assert "launch.fields.max_runtime" in r.body["detail"]
    specs = {t["instanceId"]: t["spec"] for t in await _claim(queue, "d1", capacity=5)}
    assert specs[named]["maxRuntime"] == 3600
    assert specs[unnamed]["maxRuntime"] == 1800
    assert len(specs) == 2


@pytest.mark.sqlite_only
async def test_a_claim_reads_no_row_behind_a_group_head(queue: Queue) -> None:
    """The plan of the claim query uses the queue index: no scan of the backlog."""
    await _teams(queue, "team-a")
    await seed(queue, "team-a", 50, fields=GPU_ONLY)

    def plans(conn: Conn) -> list[str]:
        from nymph.queue.sql import dispatch, schedule
        from nymph.queue.sql.dialect import indexed_by

        queue_hint = indexed_by(conn, "tasks_queue")
        claimable = dispatch._SELECT_CLAIMABLE.format(
            where="t.status = 'pending' AND t.grp IS NULL", lock="", hint=indexed_by(conn, "tasks_plain")
        )
        detail = []
        for sql, params in (
            (schedule._GROUPS.format(hint=queue_hint), ("jobs/", "jobs0", "jobs0")),
            (schedule._HEAD.format(hint=queue_hint), ("g", 0, 10**9, 10**9, -1)),
            (claimable, (10,)),
        ):
            detail += [str(r[3]) for r in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]
        return detail

    detail = await queue.store.db.read(plans)
    # no scan of the backlog (only of the small index of plain tasks: stops and probes), and
    # never through the wide (status, seq) index
    scans = [
        d
        for d in detail
        if d.startswith(("SCAN t", "SCAN a", "SCAN i")) and d != "SCAN t USING INDEX tasks_plain"
    ]
    assert scans == [] and not any("tasks_open" in d for d in detail), detail
    assert sum("tasks_queue" in d for d in detail) >= 2 and any("tasks_plain" in d for d in detail), detail


async def test_a_dockyard_launch_gets_the_namespaces_runtime_limit(queue: Queue) -> None:
    await add_kind(queue)
    await _put_quota(queue, "default", {"maxRuntime": "2h"})
    accepted = await queue.user().launch_dockyard(
        provider="kind",
        recipe=yaml.safe_load((EXAMPLES / "dockyard-grpo-vllm.yaml").read_text()),
        infra=yaml.safe_load((EXAMPLES / "dockyard-grpo-vllm.infra.yaml").read_text()),
        overrides=["infra.sandbox.replicas=1"],
    )
    [task] = await _claim(queue, "d1", capacity=1, offer=None)
    assert task["instanceId"] == accepted["instanceId"] and task["kind"] == "dockyard"
    assert task["spec"] is not None and task["spec"]["maxRuntime"] == 7200


async def test_every_page_of_a_large_backlog_says_where_each_launch_stands(queue: Queue) -> None:
    await _teams(queue, "team-a", "team-b")
    assert await _claim(queue, "d1", capacity=0) == []  # a live daemon whose node runs them all
    await seed(queue, "team-a", 1500)  # after its template, launched through the API
    urgent = await _launch(queue, "team-a", priority=5)
    user = queue.user("team-a")
    waiting: dict[str, str] = {}
    token: str | None = None
    while True:  # positions past the first ranked read's length are on the last page
        page = await user.instances_page(provider="kind", limit=500, continue_=token)
        waiting.update({i["instanceId"]: str(i.get("waiting")) for i in page.items})
        if not (token := page.continue_):
            break
    assert waiting[urgent] == "1st of 1502 in team-a"
    assert waiting["seed-team-a-000000"] == "3rd of 1502 in team-a"
    assert waiting["seed-team-a-001499"] == "1502nd of 1502 in team-a"
    # team-a now runs one and team-b none: team-b is served first, and team-a's launches say so
    [task] = await _claim(queue, "d1", capacity=1)
    assert task["instanceId"] == urgent
    await _launch(queue, "team-b")
    page = await user.instances_page(provider="kind", limit=500)
    texts = {i["instanceId"]: i.get("waiting") for i in page.items}
    assert texts["seed-team-a-000000"] == "2nd of 1501 in team-a; team-b is below its share"


async def test_quotas_hold_across_replicas_on_postgresql(pg_server: PgServer, tmp_path: Path) -> None:
    """Two replicas on one database, 20 daemons claiming at once through both: a namespace's
    maxRunning is never passed (its claims take a per-namespace lock), and another namespace's
    launches are all handed out."""
    db = pg_server.fresh_database()
    (a, ra), (b, rb) = [await open_queue(tmp_path, FAST, db=db) for _ in range(2)]
    try:
        b.user_token, b.daemon_token, b.admin_token = a.user_token, a.daemon_token, a.admin_token
        await _teams(a, "team-a", "team-b")
        await _put_quota(a, "team-a", {"maxRunning": 4})
        await seed(a, "team-a", 40)
        await seed(a, "team-b", 11)
        got = await asyncio.gather(*(_claim(a if i % 2 else b, f"r{i}", capacity=2) for i in range(20)))
        tasks = [t for batch in got for t in batch]
        assert len({t["taskId"] for t in tasks}) == len(tasks)
        assert sum(1 for t in tasks if t["namespace"] == "team-a") == 4
        assert sum(1 for t in tasks if t["namespace"] == "team-b") == 12
    finally:
        for q, runner in ((a, ra), (b, rb)):
            await q.close()
            await runner.cleanup()
        pg_server.drop_database(db)


async def test_short_launches_of_a_small_namespace_are_not_held_behind_a_large_backlog(queue: Queue) -> None:
    """Each launch ends before the next claim (nothing is running when a claim decides): the two
    namespaces are still served in turn, not the oldest backlog first."""
    await _teams(queue, "team-a", "team-b")
    await seed(queue, "team-a", 2000)
    small = {await _launch(queue, "team-b") for _ in range(5)}
    d = _daemon(queue, "d1")
    order = []
    for seq in range(12):
        [task] = await _claim(queue, "d1", capacity=1)
        order.append(task["namespace"])
        await d.complete(daemon_id="d1", task_id=task["taskId"], ok=True)
        report = {"seq": seq + 1, "instanceId": task["instanceId"], "state": "stopped", "reason": "Completed"}
        await d.report(daemon_id="d1", stream="s1", reports=[report])
    assert order[:10].count("team-b") == 5, order
    assert small <= {i["instanceId"] for i in await queue.user("team-b").list_instances(provider="kind")}


async def _waiting_events(q: Queue, ns: str, iid: str) -> list[tuple[list[str], str | None, str | None]]:
    r = await q.call("GET", f"/v1/namespaces/{ns}/events?instance={iid}")
    assert r.status == 200, r.body
    return [(e["changes"], e["waitingKind"], e["waiting"]) for e in r.body["items"]]


async def _events_become(q: Queue, ns: str, iid: str, want: list[Any]) -> None:
    """Sweep until ``iid``'s events are ``want`` (a sweep returns at once when the queue's own
    sweeper holds the lock: its commit is then waited for here), then twice more: nothing new."""
    deadline = time.monotonic() + 10
    while (got := await _waiting_events(q, ns, iid)) != want:
        assert time.monotonic() < deadline, got
        await q.store.sweep()
        await asyncio.sleep(0.05)
    for _ in range(2):
        await q.store.sweep()
    assert await _waiting_events(q, ns, iid) == want


async def test_the_event_stream_tells_when_a_quota_or_a_share_starts_and_stops_holding_a_launch(
    queue: Queue,
) -> None:
    await _teams(queue, "team-a", "team-b")
    assert await _claim(queue, "d1", capacity=0) == []  # a live daemon whose node runs them all
    await _put_quota(queue, "team-a", {"maxRunning": 1})
    first, held = await _launch(queue, "team-a"), await _launch(queue, "team-a")
    assert [t["instanceId"] for t in await _claim(queue, "d1", capacity=1)] == [first]
    created = (["created", "state"], None, None)
    quota = (["waiting"], "Quota", "team-a at maxRunning 1 of 1; 1st of 1 in team-a")
    await _events_become(queue, "team-a", held, [created, quota])
    await _put_quota(queue, "team-a", {"maxRunning": 5})  # it no longer holds: its turn again
    turn = (["waiting"], None, "1st of 1 in team-a")
    await _events_become(queue, "team-a", held, [created, quota, turn])
    # team-b (running none) is below team-a's share now: it is served first, and team-a's says so
    other = await _launch(queue, "team-b")
    share = (["waiting"], "FairShare", "1st of 1 in team-a; team-b is below its share")
    await _events_become(queue, "team-a", held, [created, quota, turn, share])
    assert await _waiting_events(queue, "team-b", other) == [created]
    assert [t["instanceId"] for t in await _claim(queue, "d1", capacity=1)] == [other]
    await _events_become(queue, "team-a", held, [created, quota, turn, share, turn])
