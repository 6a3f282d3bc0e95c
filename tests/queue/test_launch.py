"""Launches, instances, long-polls, stops, logs and probes over real HTTP."""

from __future__ import annotations

import asyncio
import time

import pytest

from nymph.client import QueueConflict, QueueNotFound
from nymph.launch.spec import LaunchSpec
from nymph.queue.launchbatch import BATCH_TASK
from tests.support.dispatch_helpers import take
from tests.support.queue_helpers import Queue

NS = "/v1/namespaces/default"
LAUNCH = NS + "/providers/kind/launch"
INSTANCES = NS + "/providers/kind/instances"


async def _launch(q: Queue, **extra: object) -> str:
    r = await q.call("POST", LAUNCH, json_body={"mode": "small", "script": "print('hi')", **extra})
    assert r.status == 202, r.body
    return str(r.body["instanceId"])


async def test_launch_is_validated_queued_and_carries_its_spec(kind: Queue) -> None:
    body = {
        "mode": "small",
        "script": "print('hi')\n",
        "tags": {"team": "ml"},
        "env": {"EPOCHS": 3},
        "fields": {"resources": {"limits": {"cpu": "1"}}},
    }
    r = await kind.call("POST", LAUNCH, json_body=body)
    assert r.status == 202
    assert set(r.body) == {"instanceId", "state", "providerName", "launchedAt"}
    assert r.body["state"] == "queued" and r.body["providerName"] == "kind"
    iid = r.body["instanceId"]
    assert iid.startswith("lakeshore-") and len(iid) == len("lakeshore-") + 8

    inst = (await kind.call("GET", f"{INSTANCES}/{iid}")).body
    assert inst["state"] == "queued" and inst["version"] == 1 and inst["reason"] is None
    assert inst["namespace"] == "default" and inst["kubeNamespace"] == "jobs"
    assert inst["requester"].startswith("alice (tok-")
    assert [h["state"] for h in inst["history"]] == ["queued"]
    assert inst["launchedAt"] == r.body["launchedAt"]

    [task] = await kind.daemon().claim(daemon_id="d1", node="n1", capacity=5, wait=0)
    assert task["kind"] == "launch" and task["instanceId"] == iid and task["attempt"] == 1
    assert task["namespace"] == "default" and task["kubeNamespace"] == "jobs"
    assert task["requester"] == inst["requester"]
    spec = LaunchSpec.from_json(task["spec"])
    assert spec.instance_id == iid and spec.image == "python:3.12-slim"
    assert spec.script == "print('hi')\n" and ("EPOCHS", "3") in spec.env
    assert ("team", "ml") in spec.labels and spec.resources == {"limits": {"cpu": "1"}}


async def test_a_launch_is_one_database_transaction(kind: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    """A launch POST reads its provider inside its own write transaction, not in a read of its
    own before it: one call to the database (on PostgreSQL, one fewer network round trip). The
    queue's own background tasks (the lease sweeper, the daemons' last-seen flush), which may
    run meanwhile, are not the launch's calls."""
    await _launch(kind)  # the token is looked up and cached once
    db = kind.store.db
    calls: list[str] = []
    for verb in ("read", "read_one", "read_small", "write"):
        real = getattr(db, verb)

        def counted(fn: object, *, _real: object = real, _verb: str = verb) -> object:
            task = asyncio.current_task()
            name = "" if task is None else task.get_name()
            if not name.startswith("nymph-queue-") or name == BATCH_TASK:  # (the launch's batch)
                calls.append(_verb)
            return _real(fn)  # type: ignore[operator]

        monkeypatch.setattr(db, verb, counted)
    await _launch(kind)
    assert calls == ["write"]


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"mode": "bare", "script": "print(1)"}, 400, "mode.image"),
        ({"mode": "small", "script": "print(1)", "tags": {"bad key!": "x"}}, 400, "tags.bad key!"),
        ({"mode": "small", "script": "print(1)", "tags": {"team": "not valid!"}}, 400, "tags.team"),
        ({"mode": "small", "script": ""}, 400, "launch.script"),
        ({"mode": "small"}, 400, "launch.script"),
        ({"mode": "small", "script": "x", "colour": 1}, 400, "launch.colour"),
        ({"mode": "small", "script": "x", "fields": {"gpu": 1}}, 400, "launch.fields.gpu"),
        ({"mode": "small", "script": "x", "tags": ["a"]}, 422, "body.tags"),
        ({"script": "print(1)"}, 422, "body.mode"),
        ({"mode": 3, "script": "print(1)"}, 422, "body.mode"),
        ({"mode": "nope", "script": "print(1)"}, 404, "nope"),
        ({"mode": "elsewhere", "script": "print(1)"}, 400, "other"),
        ({"mode": "small", "script": "x" * 130_000}, 400, "launch.script"),
    ],
)
async def test_invalid_launches_are_refused_before_anything_is_queued(
    kind: Queue, body: dict[str, object], status: int, needle: str
) -> None:
    await kind.call("POST", NS + "/modes", json_body={"name": "bare", "provider": "kind", "fields": {}})
    await kind.call(
        "POST", NS + "/providers", json_body={"name": "other", "launcher": "Kube", "dispatch": "daemon"}
    )
    await kind.call(
        "POST", NS + "/modes", json_body={"name": "elsewhere", "provider": "other", "fields": {"image": "x"}}
    )
    r = await kind.call("POST", LAUNCH, json_body=body)
    assert r.status == status, r.body
    assert needle in r.body["detail"]
    assert (await kind.call("GET", INSTANCES)).body == {"items": []}
    assert await kind.daemon().claim(daemon_id="d1", node="n1", capacity=5, wait=0) == []


async def test_unknown_provider_is_404(kind: Queue) -> None:
    r = await kind.call("POST", NS + "/providers/ghost/launch", json_body={"mode": "small", "script": "x"})
    assert r.status == 404 and r.body["error"] == "provider_not_found"


async def test_idempotency_key(kind: Queue) -> None:
    body = {"mode": "small", "script": "print(1)"}
    h = {"Idempotency-Key": "k-1"}
    first = await kind.call("POST", LAUNCH, json_body=body, headers=h)
    again = await kind.call("POST", LAUNCH, json_body=body, headers=h)
    assert first.status == again.status == 202
    assert first.body == again.body
    r = await kind.call("POST", LAUNCH, json_body={**body, "script": "print(2)"}, headers=h)
    assert r.status == 409 and r.body["error"] == "idempotency_key_reused"
    assert len((await kind.call("GET", INSTANCES)).body["items"]) == 1
    # Keys are per namespace + provider: the same key elsewhere is a new launch.
    await kind.call(
        "POST", NS + "/providers", json_body={"name": "kind2", "launcher": "Kube", "dispatch": "daemon"}
    )
    await kind.call("PUT", NS + "/modes/small", json_body={"fields": {"image": "python:3.12-slim"}})
    other = await kind.call("POST", NS + "/providers/kind2/launch", json_body=body, headers=h)
    assert other.status == 202 and other.body["instanceId"] != first.body["instanceId"]
    # A retried POST racing itself still yields one instance.
    key = {"Idempotency-Key": "k-race"}
    answers = await asyncio.gather(
        *(kind.call("POST", LAUNCH, json_body=body, headers=key) for _ in range(8))
    )
    assert {a.status for a in answers} == {202}
    assert len({a.body["instanceId"] for a in answers}) == 1
    assert len((await kind.call("GET", INSTANCES)).body["items"]) == 2
    tasks = await kind.daemon().claim(daemon_id="d", node="n", capacity=50, wait=0)
    assert len(tasks) == 3
    r = await kind.call("POST", LAUNCH, json_body=body, headers={"Idempotency-Key": "x" * 300})
    assert r.status == 400 and r.body["error"] == "invalid_idempotency_key"


async def test_list_and_filter_instances(kind: Queue) -> None:
    a = await _launch(kind)
    b = await _launch(kind)
    d = kind.daemon()
    assert await take(d, daemon_id="d", node="n1", count=2) == [a, b]
    await d.report(
        daemon_id="d", stream="s", reports=[{"seq": 1, "instanceId": b, "state": "running", "node": "n1"}]
    )
    r = await kind.call("GET", INSTANCES)
    assert [i["instanceId"] for i in r.body["items"]] == [a, b]
    r = await kind.call("GET", INSTANCES + "?state=running")
    assert [i["instanceId"] for i in r.body["items"]] == [b]
    r = await kind.call("GET", INSTANCES + "?state=flying")
    assert r.status == 400 and r.body["error"] == "invalid_query"
    r = await kind.call("GET", INSTANCES + "/lakeshore-ffffffff")
    assert r.status == 404 and r.body["error"] == "instance_not_found"
    # An instance is only visible under its own provider and namespace.
    assert (await kind.call("GET", f"/v1/namespaces/other/providers/kind/instances/{a}")).status == 404


async def test_long_poll_wakes_on_change(kind: Queue) -> None:
    iid = await _launch(kind)
    user = kind.user()
    d = kind.daemon()
    assert await take(d, daemon_id="d", node="n1") == [iid]
    t0 = time.monotonic()
    same = await user.get_instance(provider="kind", instance_id=iid, after=0, wait=5)
    assert same["version"] == 1 and time.monotonic() - t0 < 2  # already newer: at once (wait was 5 s)
    t0 = time.monotonic()
    unchanged = await user.get_instance(provider="kind", instance_id=iid, after=1, wait=0.3)
    assert unchanged["version"] == 1 and 0.25 < time.monotonic() - t0 < 5

    async def report_later() -> float:
        await asyncio.sleep(0.3)
        await d.report(
            daemon_id="d",
            stream="s",
            reports=[{"seq": 1, "instanceId": iid, "state": "starting", "node": "n1"}],
        )
        return time.monotonic()

    poll = asyncio.create_task(user.get_instance(provider="kind", instance_id=iid, after=1, wait=20))
    reported_at = await report_later()
    changed = await poll
    assert changed["state"] == "starting" and changed["version"] == 2
    assert time.monotonic() - reported_at < 2  # woken by the report, not by the 20 s wait
    assert len(kind.store.instance_changed) == 0  # no waiter entries left behind
    for bad in ("after=x", "wait=61", "wait=-1", "after=1&wait=nan"):
        r = await kind.call("GET", f"{INSTANCES}/{iid}?{bad}")
        assert r.status == 400 and r.body["error"] == "invalid_query", bad


async def test_stop_before_launch_cancels_it(kind: Queue) -> None:
    iid = await _launch(kind)
    r = await kind.call("DELETE", f"{INSTANCES}/{iid}")
    assert r.status == 204
    inst = (await kind.call("GET", f"{INSTANCES}/{iid}")).body
    assert inst["state"] == "stopped" and inst["reason"] == "Stopped"
    assert [h["state"] for h in inst["history"]] == ["queued", "stopped"]
    # Neither the launch nor a stop is left for a daemon.
    assert await kind.daemon().claim(daemon_id="d", node="n1", capacity=10, wait=0.3) == []
    # Stopping again is a no-op 204; unknown ids are 404.
    assert (await kind.call("DELETE", f"{INSTANCES}/{iid}")).status == 204
    assert (await kind.call("GET", f"{INSTANCES}/{iid}")).body["version"] == inst["version"]
    r = await kind.call("DELETE", f"{INSTANCES}/lakeshore-00000000")
    assert r.status == 404


async def test_stop_while_leased_waits_for_the_launch(kind: Queue) -> None:
    iid = await _launch(kind)
    d1, d2 = kind.daemon(), kind.daemon()
    [launch] = await d1.claim(daemon_id="d1", node="n1", capacity=1, wait=0)
    await kind.user().stop(provider="kind", instance_id=iid, grace_period_seconds=5)
    await kind.user().stop(provider="kind", instance_id=iid)  # a second request adds nothing
    inst = await kind.user().get_instance(provider="kind", instance_id=iid)
    assert inst["state"] == "stopping"
    # The stop is ordered after the in-flight launch: nobody can take it yet.
    assert await d2.claim(daemon_id="d2", node="n1", capacity=10, wait=0.2) == []
    waiting = asyncio.create_task(d2.claim(daemon_id="d2", node="n1", capacity=10, wait=10))
    await asyncio.sleep(0.1)
    await d1.complete(daemon_id="d1", task_id=launch["taskId"], ok=True)
    [stop] = await asyncio.wait_for(waiting, 2)
    assert stop["kind"] == "stop" and stop["instanceId"] == iid and stop["spec"] is None
    assert stop["gracePeriodSeconds"] == 5
    assert await d1.claim(daemon_id="d1", node="n1", capacity=10, wait=0) == []
    await d2.complete(daemon_id="d2", task_id=stop["taskId"], ok=True)
    inst = await kind.user().get_instance(provider="kind", instance_id=iid)
    assert inst["state"] == "stopped" and inst["reason"] == "Stopped"
    assert inst["node"] == "n1"  # learnt from the completed launch


async def test_stop_task_goes_to_the_instance_node_then_anyone(kind: Queue) -> None:
    iid = await _launch(kind)
    d = kind.daemon()
    [launch] = await d.claim(daemon_id="d1", node="n1", capacity=1, wait=0)
    await d.complete(daemon_id="d1", task_id=launch["taskId"], ok=True)
    await d.report(
        daemon_id="d1", stream="d1", reports=[{"seq": 1, "instanceId": iid, "state": "running", "node": "n1"}]
    )
    stopped = time.monotonic()  # the stop task is created after this
    await kind.user().stop(provider="kind", instance_id=iid)
    assert await d.claim(daemon_id="d2", node="n2", capacity=5, wait=0) == []
    # After the node fallback (1 s in these tests) a daemon on another node may take it; the
    # held claim wakes at that moment without any insert (well before its 5 s hold ends).
    t0 = time.monotonic()
    [stop] = await d.claim(daemon_id="d2", node="n2", capacity=5, wait=5)
    assert stop["kind"] == "stop"
    assert time.monotonic() - stopped > 0.95 and time.monotonic() - t0 < 4


async def test_stop_task_on_same_node_is_immediate(kind: Queue) -> None:
    iid = await _launch(kind)
    d = kind.daemon()
    [launch] = await d.claim(daemon_id="d1", node="n1", capacity=1, wait=0)
    await d.complete(daemon_id="d1", task_id=launch["taskId"], ok=True)
    await kind.user().stop(provider="kind", instance_id=iid)
    [stop] = await d.claim(daemon_id="d1", node="n1", capacity=5, wait=0)
    assert stop["kind"] == "stop"


async def test_logs(kind: Queue) -> None:
    iid = await _launch(kind)
    r = await kind.call("GET", f"{INSTANCES}/{iid}/logs")
    assert r.status == 200 and r.body == {"instanceId": iid, "logs": None}
    d = kind.daemon()
    assert await take(d, daemon_id="d1", node="n1") == [iid]
    await d.upload_logs(daemon_id="d1", instance_id=iid, logs="line 1\nline 2\n")
    assert await kind.user().get_logs(provider="kind", instance_id=iid) == "line 1\nline 2\n"
    big = "".join(f"{i:07d}\n" for i in range(60_000))  # 480 KB
    await d.upload_logs(daemon_id="d1", instance_id=iid, logs=big)
    kept = await kind.user().get_logs(provider="kind", instance_id=iid)
    assert kept is not None and len(kept.encode()) <= 256 * 1024
    assert kept.endswith("0059999\n") and kept.startswith("[nymph: first ")
    assert (await kind.call("GET", f"{INSTANCES}/lakeshore-00000000/logs")).status == 404
    with pytest.raises(QueueNotFound):
        await d.upload_logs(daemon_id="d1", instance_id="lakeshore-00000000", logs="x")
    r = await kind.call(
        "POST", "/v1/dispatch/logs", token="daemon", json_body={"daemonId": "d1", "logs": "x"}
    )
    assert r.status == 422


async def test_probe_task(kind: Queue) -> None:
    user, d = kind.user(), kind.daemon()
    task_id = await user.test_provider(provider="kind")
    status = await user.get_task(task_id=task_id)
    assert status == {
        "taskId": task_id,
        "kind": "probe",
        "status": "pending",
        "result": None,
        "error": None,
        "attempts": 0,
    }
    [probe] = await d.claim(daemon_id="d1", node="n1", capacity=5, wait=0)
    assert probe["kind"] == "probe" and probe["spec"]["image"] == "busybox"
    assert probe["kubeNamespace"] == "jobs"
    assert (await user.get_task(task_id=task_id))["status"] == "leased"
    checks = {"checks": [{"name": "dry-run", "ok": True, "detail": "accepted"}]}
    await d.complete(daemon_id="d1", task_id=task_id, ok=True, result=checks)
    done = await user.get_task(task_id=task_id)
    assert done["status"] == "done" and done["result"] == checks and done["attempts"] == 1
    # With a mode, the probe has that mode's Pod shape.
    task_id = await user.test_provider(provider="kind", mode="small")
    [probe] = await d.claim(daemon_id="d1", node="n1", capacity=5, wait=0)
    assert probe["taskId"] == task_id and probe["spec"]["image"] == "python:3.12-slim"
    # Probes create no instance.
    assert (await kind.call("GET", INSTANCES)).body == {"items": []}
    r = await kind.call("GET", NS + "/tasks/task-nope")
    assert r.status == 404
    assert (await kind.call("GET", "/v1/namespaces/other/tasks/" + task_id)).status == 404
    r = await kind.call("POST", NS + "/providers/kind/test", json_body={"mode": "ghost"})
    assert r.status == 404
    r = await kind.call("POST", NS + "/providers/kind/test", json_body={"mood": "x"})
    assert r.status == 422
    daemons = await user.list_daemons()
    assert [(x["daemonId"], x["node"], x["capacity"]) for x in daemons] == [("d1", "n1", 5)]


async def test_conflicting_complete(kind: Queue) -> None:
    await _launch(kind)
    d = kind.daemon()
    [task] = await d.claim(daemon_id="d1", node="n1", capacity=1, wait=0)
    with pytest.raises(QueueConflict):
        await d.complete(daemon_id="someone-else", task_id=task["taskId"], ok=True)
    with pytest.raises(QueueNotFound):
        await d.complete(daemon_id="d1", task_id="task-unknown", ok=True)
    assert (await d.complete(daemon_id="d1", task_id=task["taskId"], ok=True))["status"] == "done"
    again = await d.complete(daemon_id="d1", task_id=task["taskId"], ok=True)
    assert again == {"status": "done", "duplicate": True}
