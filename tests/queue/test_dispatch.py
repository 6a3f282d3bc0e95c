"""The dispatch protocol: claims, leases, retries, reports, reconciliation, shutdown."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest

from nymph.client import QueueConflict, QueueError
from nymph.protocol import parse_iso
from tests.support.dispatch_helpers import apply, take
from tests.support.queue_helpers import FAST, Queue, add_kind, open_queue

NS = "/v1/namespaces/default"
CLAIM = "/v1/dispatch/claim"


async def _launch(q: Queue, n: int = 1) -> list[str]:
    user = q.user()
    return [
        (await user.launch(provider="kind", mode="small", script=f"print({i})"))["instanceId"]
        for i in range(n)
    ]


async def test_claim_validation(kind: Queue) -> None:
    good = {"daemonId": "d1", "node": "n1", "capacity": 1, "wait": 0}
    for patch in (
        {"capacity": -1},
        {"capacity": "2"},
        {"capacity": True},
        {"capacity": None},
        {"wait": 61},
        {"wait": "soon"},
        {"daemonId": ""},
        {"node": 5},
        {"node": ["n1"]},
        {"namespaces": "jobs"},
        {"namespaces": ["Not_A_Namespace"]},
        {"leaseSeconds": 0},
    ):
        r = await kind.call("POST", CLAIM, token="daemon", json_body={**good, **patch})
        assert r.status == 422 and r.body["error"] == "invalid_body", patch
        assert r.body["detail"].startswith("body."), r.body
    r = await kind.call(
        "POST", CLAIM, token="daemon", data=b"{", headers={"Content-Type": "application/json"}
    )
    assert r.status == 400 and r.body["error"] == "invalid_json"
    r = await kind.call("POST", CLAIM, token="daemon", json_body=good)
    assert r.status == 200 and r.body == {"tasks": []}


async def test_capacity_and_fifo(kind: Queue) -> None:
    ids = await _launch(kind, 5)
    d = kind.daemon()
    got = []
    for expected in (2, 2, 1, 0):
        tasks = await d.claim(daemon_id="d1", node="n1", capacity=2, wait=0)
        assert len(tasks) == expected
        got += [t["instanceId"] for t in tasks]
    assert got == ids
    # capacity 0 is a heartbeat: it holds, hands out nothing, and records the daemon.
    await _launch(kind, 1)
    t0 = time.monotonic()
    assert await d.claim(daemon_id="d2", node="n2", capacity=0, wait=0.3) == []
    assert time.monotonic() - t0 >= 0.25
    assert {x["daemonId"] for x in await kind.user().list_daemons()} == {"d1", "d2"}


async def test_empty_claim_holds_for_wait_and_wakes_on_insert(kind: Queue) -> None:
    d = kind.daemon()
    t0 = time.monotonic()
    assert await d.claim(daemon_id="d1", node="n1", capacity=1, wait=0.4) == []
    assert 0.35 < time.monotonic() - t0 < 5
    claim = asyncio.create_task(d.claim(daemon_id="d1", node="n1", capacity=1, wait=20))
    await asyncio.sleep(0.3)
    posted = time.monotonic()
    [iid] = await _launch(kind)
    tasks = await claim
    assert [t["instanceId"] for t in tasks] == [iid]
    assert time.monotonic() - posted < 2  # woken by the insert, not by the 20 s wait


async def test_kube_namespace_filter(queue: Queue) -> None:
    await add_kind(queue, kube_ns="ns-a")
    [iid] = await _launch(queue)
    d = queue.daemon()
    assert await d.claim(daemon_id="d1", node="n1", namespaces=["ns-b"], capacity=5, wait=0) == []
    [task] = await d.claim(daemon_id="d2", node="n2", namespaces=["ns-b", "ns-a"], capacity=5, wait=0)
    assert task["instanceId"] == iid and task["kubeNamespace"] == "ns-a"


async def test_renew_release_and_lost(kind: Queue) -> None:
    await _launch(kind, 2)
    d, d2 = kind.daemon(), kind.daemon()  # one client (and session) per daemon
    a, b = await d.claim(daemon_id="d1", node="n1", capacity=2, wait=0, lease_seconds=30)
    r = await d.renew(daemon_id="d1", task_ids=[a["taskId"], "task-nope"], lease_seconds=30)
    assert r == {"renewed": [a["taskId"]], "lost": ["task-nope"]}
    assert await d2.renew(daemon_id="d2", task_ids=[a["taskId"]]) == {"renewed": [], "lost": [a["taskId"]]}
    assert await d2.release(daemon_id="d2", task_ids=[b["taskId"]]) == []
    assert await d.release(daemon_id="d1", task_ids=[b["taskId"]]) == [b["taskId"]]
    # Released: claimable again at once, and the attempt was not counted.
    [again] = await d2.claim(daemon_id="d2", node="n2", capacity=5, wait=0)
    assert again["taskId"] == b["taskId"] and again["attempt"] == 1
    assert (await d.renew(daemon_id="d1", task_ids=[b["taskId"]]))["lost"] == [b["taskId"]]
    with pytest.raises(QueueConflict):
        await d.complete(daemon_id="d1", task_id=b["taskId"], ok=True)


async def test_release_all_hands_back_every_lease_of_the_daemon_and_no_other(kind: Queue) -> None:
    """A stopping daemon hands back all it holds, tasks it never saw the claim answer of
    included, without counting their attempts; another daemon's leases stay."""
    await _launch(kind, 3)
    d, other = kind.daemon(), kind.daemon()
    mine = await d.claim(daemon_id="d1", node="n1", capacity=2, wait=0, lease_seconds=30)
    [theirs] = await other.claim(daemon_id="d2", node="n2", capacity=5, wait=0, lease_seconds=30)
    assert sorted(await d.release_all(daemon_id="d1")) == sorted(t["taskId"] for t in mine)
    assert await d.release_all(daemon_id="d1") == [], "nothing left to hand back"
    assert (await other.renew(daemon_id="d2", task_ids=[theirs["taskId"]]))["renewed"] == [theirs["taskId"]]
    again = await other.claim(daemon_id="d2", node="n2", capacity=5, wait=0)
    assert sorted(t["taskId"] for t in again) == sorted(t["taskId"] for t in mine)
    assert all(t["attempt"] == 1 for t in again), "a release does not count the attempt"


async def test_release_refuses_task_ids_and_all_together(kind: Queue) -> None:
    await _launch(kind)
    d = kind.daemon()
    [task] = await d.claim(daemon_id="d1", node="n1", capacity=1, wait=0)
    with pytest.raises(QueueError, match="not both"):
        await d._dispatch(
            "POST",
            "/v1/dispatch/release",
            identity=d._identity(daemon_id="d1"),
            json={"daemonId": "d1", "taskIds": [task["taskId"]], "all": True},
        )
    assert (await d.renew(daemon_id="d1", task_ids=[task["taskId"]]))["renewed"] == [task["taskId"]]


async def test_expired_lease_is_redelivered(kind: Queue) -> None:
    [iid] = await _launch(kind)
    d, alive = kind.daemon(), kind.daemon()
    [first] = await d.claim(daemon_id="dead", node="n1", capacity=1, wait=0, lease_seconds=1)
    assert await alive.claim(daemon_id="alive", node="n2", capacity=1, wait=0) == []
    t0 = time.monotonic()
    [second] = await alive.claim(daemon_id="alive", node="n2", capacity=1, wait=5)
    assert 0.6 < time.monotonic() - t0 < 4  # woken when the lease ran out (wait was 5 s)
    assert second["taskId"] == first["taskId"] and second["instanceId"] == iid
    assert second["attempt"] == 2 and second["leaseExpiresAt"] > first["leaseExpiresAt"]
    # The dead daemon's lease is gone for good.
    assert (await d.renew(daemon_id="dead", task_ids=[first["taskId"]]))["lost"] == [first["taskId"]]
    with pytest.raises(QueueConflict) as err:
        await d.complete(daemon_id="dead", task_id=first["taskId"], ok=True)
    assert err.value.code == "lease_lost"
    assert (await alive.complete(daemon_id="alive", task_id=second["taskId"], ok=True))["status"] == "done"


async def test_sweeper_hands_back_expired_leases(kind: Queue) -> None:
    await _launch(kind)
    d = kind.daemon()
    [task] = await d.claim(daemon_id="dead", node="n1", capacity=1, wait=0, lease_seconds=1)
    await asyncio.sleep(1.5)  # lease 1 s + sweeper every 0.2 s
    status = await kind.user().get_task(task_id=task["taskId"])
    assert status["status"] == "pending"


async def test_retry_with_backoff_then_launch_failed(kind: Queue) -> None:
    [iid] = await _launch(kind)
    d = kind.daemon()
    not_before = 0.0
    for attempt in (1, 2):
        [task] = await d.claim(daemon_id="d1", node="n1", capacity=1, wait=5)
        # Not handed out again before its backoff ended (the held claim woke for it).
        assert task["attempt"] == attempt and time.time() >= not_before - 0.01
        answer = await d.complete(
            daemon_id="d1", task_id=task["taskId"], ok=False, error="api down", retryable=True
        )
        assert answer["status"] == "requeued"
        not_before = parse_iso(answer["notBefore"])
        assert not_before - time.time() > 0.05  # backoff 0.2 s, then 0.4 s
        inst = await kind.user().get_instance(provider="kind", instance_id=iid)
        assert inst["state"] == "queued" and inst["version"] == 1  # untouched while retrying
    [task] = await d.claim(daemon_id="d1", node="n1", capacity=1, wait=5)
    assert time.time() >= not_before - 0.01
    assert task["attempt"] == 3  # max_attempts is 3 in these tests
    answer = await d.complete(
        daemon_id="d1", task_id=task["taskId"], ok=False, error="admission webhook denied", retryable=True
    )
    assert answer == {"status": "failed"}
    inst = await kind.user().get_instance(provider="kind", instance_id=iid)
    assert inst["state"] == "stopped" and inst["reason"] == "LaunchFailed"
    assert inst["message"] == "admission webhook denied"
    status = await kind.user().get_task(task_id=task["taskId"])
    assert status["status"] == "failed" and status["attempts"] == 3
    assert await d.claim(daemon_id="d1", node="n1", capacity=1, wait=1.2) == []


async def test_permanent_failure_fails_at_once(kind: Queue) -> None:
    [iid] = await _launch(kind)
    d = kind.daemon()
    [task] = await d.claim(daemon_id="d1", node="n1", capacity=1, wait=0)
    assert (await d.complete(daemon_id="d1", task_id=task["taskId"], ok=False, error="forbidden"))[
        "status"
    ] == "failed"
    inst = await kind.user().get_instance(provider="kind", instance_id=iid)
    assert (inst["state"], inst["reason"], inst["message"]) == ("stopped", "LaunchFailed", "forbidden")
    # Stopping a failed instance is a no-op.
    await kind.user().stop(provider="kind", instance_id=iid)
    assert await d.claim(daemon_id="d1", node="n1", capacity=1, wait=0) == []


async def test_reports_are_idempotent_and_ordered(kind: Queue) -> None:
    [iid] = await _launch(kind)
    d = kind.daemon()
    assert await take(d, daemon_id="d1", node="n1") == [iid]
    batch = [
        {"seq": 1, "instanceId": iid, "state": "starting", "node": "n1", "at": "2030-01-01T00:00:01Z"},
        {"seq": 2, "instanceId": iid, "state": "running", "at": "2030-01-01T00:00:02Z"},
        {"seq": 3, "instanceId": "lakeshore-00000000", "state": "running"},
    ]
    assert await d.report(daemon_id="d1", stream="d1-boot1", reports=batch) == {"accepted": 3, "lastSeq": 3}
    inst = await kind.user().get_instance(provider="kind", instance_id=iid)
    assert inst["state"] == "running" and inst["node"] == "n1" and inst["version"] == 3
    assert [h["state"] for h in inst["history"]] == ["queued", "starting", "running"]
    assert inst["history"][2]["at"] == "2030-01-01T00:00:02.000Z"
    # The same batch again (a resend after an outage) changes nothing.
    assert await d.report(daemon_id="d1", stream="d1-boot1", reports=batch) == {"accepted": 0, "lastSeq": 3}
    assert (await kind.user().get_instance(provider="kind", instance_id=iid))["version"] == 3
    # Out of order within a batch: the late lower seq is ignored.
    late = [
        {"seq": 6, "instanceId": iid, "state": "stopped", "reason": "Error", "message": "exit code 1"},
        {"seq": 5, "instanceId": iid, "state": "running"},
    ]
    assert await d.report(daemon_id="d1", stream="d1-boot1", reports=late) == {"accepted": 1, "lastSeq": 6}
    # Stopped stays stopped, even for a new stream.
    revive = [{"seq": 1, "instanceId": iid, "state": "running"}]
    assert await d.report(daemon_id="d1", stream="d1-boot2", reports=revive) == {"accepted": 1, "lastSeq": 1}
    inst = await kind.user().get_instance(provider="kind", instance_id=iid)
    assert (inst["state"], inst["reason"], inst["message"]) == ("stopped", "Error", "exit code 1")
    assert [h["state"] for h in inst["history"]] == ["queued", "starting", "running", "stopped"]
    assert await d.report(daemon_id="d1", stream="fresh", reports=[]) == {"accepted": 0, "lastSeq": -1}


async def test_report_validation(kind: Queue) -> None:
    [iid] = await _launch(kind)
    base = {"seq": 1, "instanceId": iid, "state": "running"}
    for patch in ({"state": "flying"}, {"reason": "Bored"}, {"seq": -1}, {"seq": "1"}, {"at": "yesterday"}):
        r = await kind.call(
            "POST",
            "/v1/dispatch/report",
            token="daemon",
            json_body={
                "daemonId": "d",
                "stream": "s",
                "reports": [base, {**base, **patch, "seq": 2} | patch],
            },
        )
        assert r.status == 422 and "reports[1]" in r.body["detail"], patch
    # Nothing of a refused batch was applied.
    assert (await kind.user().get_instance(provider="kind", instance_id=iid))["version"] == 1


async def test_active_for_reconciliation(kind: Queue) -> None:
    a, b, c = await _launch(kind, 3)
    d = kind.daemon()
    assert await apply(d, daemon_id="d1", node="n1", count=2) == [a, b]
    d2 = kind.daemon()
    assert await apply(d2, daemon_id="d2", node="n2") == [c]
    await d.report(
        daemon_id="d1",
        stream="s",
        reports=[
            {"seq": 1, "instanceId": a, "state": "running", "node": "n1"},
            {"seq": 2, "instanceId": b, "state": "stopped", "reason": "Completed", "node": "n1"},
        ],
    )
    await d2.report(
        daemon_id="d2", stream="s2", reports=[{"seq": 1, "instanceId": c, "state": "starting", "node": "n2"}]
    )
    assert await d.active(node="n1") == [
        {"instanceId": a, "namespace": "default", "kubeNamespace": "jobs", "state": "running", "node": "n1"}
    ]
    assert [x["instanceId"] for x in await kind.daemon().active(node="n2")] == [c]
    r = await kind.call("GET", "/v1/dispatch/active", token="daemon")
    assert r.status == 400


async def test_shutdown_releases_held_long_polls(tmp_path: Path, queue_db: Path | str) -> None:
    q, runner = await open_queue(tmp_path, FAST, db=queue_db)
    await add_kind(q)
    [iid] = await _launch(q)
    d = q.daemon()
    await d.claim(daemon_id="d0", node="n0", capacity=5, wait=0)
    held_claim = asyncio.create_task(d.claim(daemon_id="d1", node="n1", capacity=1, wait=60))
    held_poll = asyncio.create_task(q.user().get_instance(provider="kind", instance_id=iid, after=1, wait=60))
    await asyncio.sleep(0.3)
    t0 = time.monotonic()
    await runner.cleanup()
    assert time.monotonic() - t0 < 3
    assert await asyncio.wait_for(held_claim, 3) == []
    assert (await asyncio.wait_for(held_poll, 3))["version"] == 1
    await q.close()


async def test_claim_client_gone_does_not_take_tasks(kind: Queue) -> None:
    """A claim whose caller hung up before work arrived does not lease that work."""
    body = {"daemonId": "gone", "node": "n1", "capacity": 1, "wait": 30}
    headers = {"Authorization": f"Bearer {await kind.session('gone', 'n1')}"}
    async with aiohttp.ClientSession() as session:
        with pytest.raises(TimeoutError):
            async with session.post(
                kind.url + CLAIM, json=body, headers=headers, timeout=aiohttp.ClientTimeout(total=0.3)
            ):
                pass
    await asyncio.sleep(0.1)
    await _launch(kind)
    await asyncio.sleep(0.3)
    tasks = await kind.daemon().claim(daemon_id="here", node="n1", capacity=1, wait=0)
    assert len(tasks) == 1 and tasks[0]["attempt"] == 1


async def test_launch_of_an_already_stopped_instance_is_not_redelivered(kind: Queue) -> None:
    [iid] = await _launch(kind)
    d = kind.daemon()
    [task] = await d.claim(daemon_id="dead", node="n1", capacity=1, wait=0, lease_seconds=1)
    # The daemon applied the Pod and its reports arrived, but it died before completing.
    await d.report(
        daemon_id="dead",
        stream="s1",
        reports=[
            {"seq": 1, "instanceId": iid, "state": "running", "node": "n1"},
            {"seq": 2, "instanceId": iid, "state": "stopped", "reason": "Completed", "node": "n1"},
        ],
    )
    await asyncio.sleep(1.2)
    assert await d.claim(daemon_id="d2", node="n1", capacity=1, wait=0) == []
    inst = await kind.user().get_instance(provider="kind", instance_id=iid)
    assert (inst["state"], inst["reason"]) == ("stopped", "Completed")
    assert task["kind"] == "launch"


async def test_a_task_whose_daemons_keep_dying_is_given_up(
    kind: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nymph.queue.sql import retire as leases

    monkeypatch.setattr(leases, "MAX_DELIVERIES", 3)
    [iid] = await _launch(kind)
    d = kind.daemon()
    for i in range(3):
        got = await d.claim(daemon_id=f"dies-{i}", node="n1", capacity=1, wait=2, lease_seconds=1)
        assert len(got) == 1 and got[0]["attempt"] == i + 1
        await asyncio.sleep(1.1)
    assert await d.claim(daemon_id="last", node="n1", capacity=1, wait=0) == []
    inst = await kind.user().get_instance(provider="kind", instance_id=iid)
    assert (inst["state"], inst["reason"]) == ("stopped", "LaunchFailed")
    assert "gave up after 3 deliveries" in inst["message"]


async def test_late_reports_and_retries_do_not_undo_a_stop(kind: Queue) -> None:
    [iid] = await _launch(kind)
    d = kind.daemon()
    [task] = await d.claim(daemon_id="d1", node="n1", capacity=1, wait=0, lease_seconds=30)
    await kind.user().stop(provider="kind", instance_id=iid)  # while the launch is in flight
    await d.report(
        daemon_id="d1", stream="s", reports=[{"seq": 1, "instanceId": iid, "state": "running", "node": "n1"}]
    )
    inst = await kind.user().get_instance(provider="kind", instance_id=iid)
    assert inst["state"] == "stopping", inst["history"]
    answer = await d.complete(
        daemon_id="d1", task_id=task["taskId"], ok=False, error="timeout", retryable=True
    )
    assert answer["status"] == "cancelled"
    [stop] = await d.claim(daemon_id="d1", node="n1", capacity=1, wait=2)
    assert stop["kind"] == "stop"
    await d.complete(daemon_id="d1", task_id=stop["taskId"], ok=True)
    inst = await kind.user().get_instance(provider="kind", instance_id=iid)
    assert (inst["state"], inst["reason"]) == ("stopped", "Stopped")
