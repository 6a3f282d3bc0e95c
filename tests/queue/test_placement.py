"""Node-aware claims: a daemon that sends its node's offer gets only launches its node can run,
capacity counts what the queue placed there, and a launch nobody can run says why it waits."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from nymph.client import QueueClient
from nymph.launch.placement import Needs
from nymph.protocol import TaskJSON
from nymph.queue.sql import placement
from tests.support.queue_helpers import Queue

CLAIM = "/v1/dispatch/claim"
CPU = {
    "name": "cpu-node",
    "labels": {"pool": "cpu"},
    "taints": [],
    "allocatable": {"cpu": "2", "memory": "4Gi"},
}
GPU = {
    "name": "gpu-node",
    "labels": {"pool": "gpu", "gpu": "a100"},
    "taints": [{"key": "gpu", "value": "a100", "effect": "NoSchedule"}],
    "allocatable": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"},
}
TOLERATE_GPU = [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]


async def _launch(q: Queue, **fields: Any) -> str:
    accepted = await q.user().launch(provider="kind", mode="small", script="true", fields=fields)
    return accepted["instanceId"]


_CLIENTS: dict[tuple[str, str], QueueClient] = {}


def _daemon(q: Queue, daemon: str) -> QueueClient:
    """One client (so one session) per daemon id and queue (its user token is unique to it: an
    ``id()`` would be reused by the next test's queue)."""
    key = (q.user_token, daemon)
    if key not in _CLIENTS:
        _CLIENTS[key] = q.daemon()
    return _CLIENTS[key]


async def _claim(
    q: Queue, daemon: str, node: str, offer: dict[str, Any] | None, capacity: int = 10
) -> list[TaskJSON]:
    return await _daemon(q, daemon).claim(
        daemon_id=daemon, node=node, capacity=capacity, wait=0, node_info=offer
    )


async def test_claims_follow_selector_taints_and_requests(kind: Queue) -> None:
    plain = await _launch(kind)
    gpu = await _launch(kind, node_selector={"gpu": "a100"}, tolerations=TOLERATE_GPU)
    untolerated = await _launch(kind, node_selector={"gpu": "a100"})
    big = await _launch(kind, resources={"requests": {"cpu": "4"}}, tolerations=TOLERATE_GPU)
    # The CPU node takes only the plain launch; the GPU node the tolerating ones.
    got = {t["instanceId"] for t in await _claim(kind, "d-cpu", "cpu-node", CPU)}
    assert got == {plain}
    got = {t["instanceId"] for t in await _claim(kind, "d-gpu", "gpu-node", GPU)}
    assert got == {gpu, big}
    assert await _claim(kind, "d-cpu", "cpu-node", CPU) == []
    assert await _claim(kind, "d-gpu", "gpu-node", GPU) == []
    # Nobody can run the untolerating one: it stays queued and, after a sweep, says why.
    await kind.store.sweep()
    inst = await kind.user().get_instance(provider="kind", instance_id=untolerated)
    assert inst["state"] == "queued"
    assert inst["waiting"].startswith("no daemon's node tolerates its taints")
    other = await kind.user().get_instance(provider="kind", instance_id=gpu)
    assert "waiting" not in other


async def test_free_capacity_counts_placed_launches(kind: Queue) -> None:
    ids = [await _launch(kind, resources={"requests": {"cpu": "1500m"}}) for _ in range(3)]
    node = dict(CPU, allocatable={"cpu": "4"})
    first = await _claim(kind, "d1", "cpu-node", node)
    assert [t["instanceId"] for t in first] == ids[:2]  # 3 cores placed; 1 free < 1.5
    assert await _claim(kind, "d1", "cpu-node", node) == []
    # A completed launch stays placed on the node until its instance stops.
    d = _daemon(kind, "d1")
    await d.complete(daemon_id="d1", task_id=first[0]["taskId"], ok=True)
    assert await _claim(kind, "d1", "cpu-node", node) == []
    await d.report(
        daemon_id="d1",
        stream="s",
        reports=[
            {"seq": 1, "instanceId": ids[0], "state": "stopped", "reason": "Completed", "node": "cpu-node"}
        ],
    )
    got = await _claim(kind, "d1", "cpu-node", node)
    assert [t["instanceId"] for t in got] == ids[2:]


async def test_a_claim_reads_what_is_placed_only_for_a_launch_that_requests_something(
    kind: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Launches that request nothing fit whatever is placed: their claim does not read the
    node's placed launches. A launch that requests something after them in the same claim is
    still held to what is free (the placed launches and this claim's picks)."""
    node = dict(CPU, allocatable={"cpu": "2"})
    placed = await _launch(kind, resources={"requests": {"cpu": "1"}})
    assert [t["instanceId"] for t in await _claim(kind, "d1", "cpu-node", node)] == [placed]
    reads: list[str] = []
    placed_on = placement.placed_on

    def counted(conn: Any, *, node: str, now: float) -> Any:
        reads.append(node)
        return placed_on(conn, node=node, now=now)

    monkeypatch.setattr(placement, "placed_on", counted)
    plain = [await _launch(kind) for _ in range(3)]
    got = await _claim(kind, "d1", "cpu-node", node)
    assert [t["instanceId"] for t in got] == plain and reads == []
    fits, too_big = (await _launch(kind), await _launch(kind, resources={"requests": {"cpu": "1500m"}}))
    small = await _launch(kind, resources={"requests": {"cpu": "1"}})
    over = await _launch(kind, resources={"requests": {"cpu": "1m"}})
    got = await _claim(kind, "d1", "cpu-node", node)
    # 1 core placed: 1.5 does not fit, 1 does, and then nothing more is free
    assert [t["instanceId"] for t in got] == [fits, small] and set(reads) == {"cpu-node"}
    assert over not in {t["instanceId"] for t in got} and too_big not in {t["instanceId"] for t in got}


async def test_waiting_reason_for_a_selector_nobody_matches(kind: Queue) -> None:
    iid = await _launch(kind, node_selector={"gpu": "h100"})
    await _claim(kind, "d-cpu", "cpu-node", CPU)
    await _claim(kind, "d-gpu", "gpu-node", GPU)
    await kind.store.sweep()
    [inst] = await kind.user().list_instances(provider="kind")
    assert inst["instanceId"] == iid and inst["state"] == "queued"
    assert inst["waiting"] == "no daemon's node matches node_selector gpu=h100"
    # A daemon without an offer (an older daemon) may take anything: the reason goes away.
    got = await _claim(kind, "d-old", "old-node", None)
    assert [t["instanceId"] for t in got] == [iid]
    await kind.store.sweep()
    [inst] = await kind.user().list_instances(provider="kind")
    assert "waiting" not in inst


async def test_a_bad_offer_is_refused(kind: Queue) -> None:
    body = {"daemonId": "d1", "node": "n1", "capacity": 1, "wait": 0}
    for bad in ({"allocatable": {"cpu": "lots"}}, {"taints": [{"value": "x"}]}, {"labels": []}, "gpu"):
        r = await kind.call("POST", CLAIM, token="daemon", json_body={**body, "nodeInfo": bad})
        assert r.status == 422 and r.body["detail"].startswith("body.nodeInfo"), (bad, r.body)


async def test_a_fitting_launch_wakes_a_waiting_claim(kind: Queue) -> None:
    claim = asyncio.create_task(
        _daemon(kind, "d-cpu").claim(daemon_id="d-cpu", node="cpu-node", capacity=1, wait=5, node_info=CPU)
    )
    await asyncio.sleep(0.2)
    await _launch(kind, node_selector={"gpu": "a100"}, tolerations=TOLERATE_GPU)
    fits = await _launch(kind, node_selector={"pool": "cpu"})
    got = await asyncio.wait_for(claim, 10)
    assert [t["instanceId"] for t in got] == [fits]


async def _unschedulable(q: Queue, daemon: str, iid: str, seq: int) -> None:
    report = {
        "seq": seq,
        "instanceId": iid,
        "state": "starting",
        "reason": "Unschedulable",
        "message": "0/2 nodes",
    }
    await _daemon(q, daemon).report(daemon_id=daemon, stream="s", reports=[report])


async def test_an_unschedulable_launch_moves_to_another_node(kind: Queue) -> None:
    iid = await _launch(kind)
    [task] = await _claim(kind, "d-a", "node-a", dict(CPU, name="node-a"))
    await _daemon(kind, "d-a").complete(daemon_id="d-a", task_id=task["taskId"], ok=True)
    await _unschedulable(kind, "d-a", iid, 1)
    inst = await kind.user().get_instance(provider="kind", instance_id=iid)
    assert inst["state"] == "queued" and inst["reason"] == "Unschedulable"
    assert "node-a" in inst["message"] and "move 1 of 3" in inst["message"]
    # Node a gets the stop that removes its Pod, then nothing more: the launch avoids it.
    [stop] = await _claim(kind, "d-a", "node-a", dict(CPU, name="node-a"))
    assert stop["kind"] == "stop" and stop["instanceId"] == iid
    await _daemon(kind, "d-a").complete(daemon_id="d-a", task_id=stop["taskId"], ok=True)
    gone = {"seq": 2, "instanceId": iid, "state": "stopped", "reason": "Deleted", "node": "node-a"}
    await _daemon(kind, "d-a").report(daemon_id="d-a", stream="s", reports=[gone])
    assert await _claim(kind, "d-a", "node-a", dict(CPU, name="node-a")) == []
    inst = await kind.user().get_instance(provider="kind", instance_id=iid)
    assert inst["state"] == "queued" and inst["node"] is None  # the Pod's removal did not end it
    [again] = await _claim(kind, "d-b", "node-b", dict(CPU, name="node-b"))
    assert again["kind"] == "launch" and again["instanceId"] == iid
    assert again["spec"] is not None and again["spec"]["avoidNodes"] == ["node-a"]
    await _daemon(kind, "d-b").complete(daemon_id="d-b", task_id=again["taskId"], ok=True)
    inst = await kind.user().get_instance(provider="kind", instance_id=iid)
    assert inst["node"] == "node-b"


async def test_moves_are_bounded(kind: Queue) -> None:
    iid = await _launch(kind)
    for n in range(4):
        daemon, node = f"d{n}", f"node-{n}"
        offer = dict(CPU, name=node)
        [task] = await _claim(kind, daemon, node, offer)
        assert task["kind"] == "launch"
        await _daemon(kind, daemon).complete(daemon_id=daemon, task_id=task["taskId"], ok=True)
        await _unschedulable(kind, daemon, iid, 1)
        inst = await kind.user().get_instance(provider="kind", instance_id=iid)
        if n < 3:
            assert inst["state"] == "queued", inst
            [stop] = await _claim(kind, daemon, node, offer)
            await _daemon(kind, daemon).complete(daemon_id=daemon, task_id=stop["taskId"], ok=True)
        else:  # the fourth time it stays where it is, Unschedulable, for the user to see
            assert inst["state"] == "starting" and inst["reason"] == "Unschedulable"
            assert inst["node"] == node


async def test_a_moved_launch_counts_once_where_it_went(kind: Queue) -> None:
    iid = await _launch(kind, resources={"requests": {"cpu": "2"}})
    node_a, node_b = dict(CPU, name="node-a"), dict(CPU, name="node-b", allocatable={"cpu": "4"})
    [task] = await _claim(kind, "d-a", "node-a", node_a)
    await _daemon(kind, "d-a").complete(daemon_id="d-a", task_id=task["taskId"], ok=True)
    await _unschedulable(kind, "d-a", iid, 1)
    [stop] = await _claim(kind, "d-a", "node-a", node_a)
    await _daemon(kind, "d-a").complete(daemon_id="d-a", task_id=stop["taskId"], ok=True)
    [again] = await _claim(kind, "d-b", "node-b", node_b)
    await _daemon(kind, "d-b").complete(daemon_id="d-b", task_id=again["taskId"], ok=True)
    # node-b (4 cpu) holds the moved launch counted once: another 2-cpu launch fits beside it.
    other = await _launch(kind, resources={"requests": {"cpu": "2"}})
    got = await _claim(kind, "d-b", "node-b", node_b)
    assert [t["instanceId"] for t in got] == [other]


async def test_the_sweep_reads_every_node_s_placed_launches_as_each_claim_does(kind: Queue) -> None:
    """What the sweep reads for all nodes at once is what a claim reads for its one node:
    launches applied there and not stopped, and those leased to its daemon, a moved one not."""
    cpu = {"resources": {"requests": {"cpu": "1"}}}
    done_a, leased_b, stopped_a, moved = [await _launch(kind, **cpu) for _ in range(4)]
    node_a, node_b = dict(CPU, name="node-a", allocatable={"cpu": "2"}), dict(CPU, name="node-b")
    [ta, tb] = await _claim(kind, "d-a", "node-a", node_a, capacity=2)
    await _daemon(kind, "d-a").complete(daemon_id="d-a", task_id=ta["taskId"], ok=True)
    await _daemon(kind, "d-a").complete(daemon_id="d-a", task_id=tb["taskId"], ok=True)
    report = {"seq": 1, "instanceId": tb["instanceId"], "state": "stopped", "reason": "Completed"}
    await _daemon(kind, "d-a").report(daemon_id="d-a", stream="s", reports=[{**report, "node": "node-a"}])
    [tc, td] = await _claim(kind, "d-b", "node-b", node_b, capacity=2)  # leased, not completed
    await _daemon(kind, "d-b").complete(daemon_id="d-b", task_id=td["taskId"], ok=True)
    await _unschedulable(kind, "d-b", td["instanceId"], 1)  # moved off node-b: waits for its stop
    assert {ta["instanceId"], tb["instanceId"], tc["instanceId"], td["instanceId"]} == {
        done_a,
        stopped_a,
        leased_b,
        moved,
    }

    def read(conn: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        now = time.time()
        each = {n: placement.placed_on(conn, node=n, now=now) for n in ("node-a", "node-b", "node-c")}
        return each, placement.placed_by_node(conn, now=now)

    each, together = await kind.store.db.read(read)
    # node-a: the applied launch (the stopped one no longer); node-b: the leased one (the moved
    # one counts where it goes next, not here).
    assert each == {"node-a": {"cpu": 1}, "node-b": {"cpu": 1}, "node-c": {}}
    assert together == {n: used for n, used in each.items() if used}


def test_a_placed_launch_s_spec_is_parsed_once_however_many_claims_read_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every claim adds up the requests of the launches placed on its node: the needs parsed
    from a spec text are kept (by its hash and length, in bounded memory), so a busy node's
    hundreds of specs are not parsed again at each claim; other texts get their own needs, the
    kept ones cannot be changed by a caller, and the oldest go first."""
    parsed: list[str | None] = []
    real = placement._parse_needs

    def counting(text: str | None) -> Needs:
        parsed.append(text)
        return real(text)

    monkeypatch.setattr(placement, "_parse_needs", counting)
    cache = placement.NeedsCache(size=2)
    one = '{"resources": {"requests": {"cpu": "1"}}}'
    two = '{"resources": {"requests": {"cpu": "2", "memory": "1Gi"}}}'
    first = cache(one)
    assert cache("".join(list(one))) is first  # an equal text read again (a new string)
    assert parsed == [one]
    assert dict(first.requests) == {"cpu": 1}
    assert dict(cache(two).requests) == {"cpu": 2, "memory": 2**30}
    assert parsed == [one, two]
    with pytest.raises(TypeError):
        first.requests["cpu"] = 5  # type: ignore[index]
    assert dict(cache(one).requests) == {"cpu": 1}
    cache('{"resources": {}}')  # a third text: the oldest (one) goes
    assert len(parsed) == 3
    cache(one)
    assert len(parsed) == 4
    assert cache(None) == cache("") == Needs()  # no spec: no needs, nothing kept
    assert len(parsed) == 4


async def test_the_sweep_reads_the_daemons_offers_only_while_a_launch_waits(
    kind: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every sweep (each replica, every few seconds) reads the live daemons' offers only when a
    queued launch waits for one: with a thousand live daemons and nothing queued, there is
    nothing to give a reason to, and a thousand offers to parse."""
    reads = [0]
    real = placement._live_offers

    def counted(*args: Any, **kwargs: Any) -> Any:
        reads[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(placement, "_live_offers", counted)
    await _claim(kind, "d-cpu", "cpu-node", CPU)
    await kind.store.sweep()
    assert reads[0] == 0
    iid = await _launch(kind, node_selector={"gpu": "h100"})
    await kind.store.sweep()
    assert reads[0] >= 1  # (the replica's own sweeper may have run one too)
    [inst] = await kind.user().list_instances(provider="kind")
    assert inst["instanceId"] == iid and inst["waiting"] == "no daemon's node matches node_selector gpu=h100"
