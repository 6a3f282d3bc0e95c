"""Dockyard launches through the queue: validation before acceptance, the task a daemon gets,
failures, stops (which carry the spec so the daemon can delete the objects) and idempotency."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from nymph.dockyard.render.task import dockyard_task_manifests
from tests.support.queue_helpers import Queue

NS = "/v1/namespaces/default"
DOCKYARD = NS + "/providers/kind/dockyard"
INSTANCES = NS + "/providers/kind/instances"
EXAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "examples"


def example(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text())
    return data


RECIPE = example("dockyard-grpo-vllm.yaml")
INFRA = example("dockyard-grpo-vllm.infra.yaml")
BODY: dict[str, Any] = {"recipe": RECIPE, "infra": INFRA, "overrides": ["infra.sandbox.replicas=2"]}


async def _submit(q: Queue, body: dict[str, Any] | None = None, **headers: str) -> str:
    r = await q.call("POST", DOCKYARD, json_body=body or BODY, headers=headers or None)
    assert r.status == 202, r.body
    return str(r.body["instanceId"])


async def test_dockyard_launch_is_validated_queued_and_carries_its_spec(kind: Queue) -> None:
    r = await kind.call("POST", DOCKYARD, json_body=BODY)
    assert r.status == 202, r.body
    assert set(r.body) == {"instanceId", "state", "providerName", "launchedAt"}
    assert r.body["state"] == "queued" and r.body["providerName"] == "kind"
    iid = r.body["instanceId"]
    assert iid.startswith("lakeshore-")
    inst = (await kind.call("GET", f"{INSTANCES}/{iid}")).body
    assert (inst["state"], inst["kubeNamespace"], inst["node"]) == ("queued", "jobs", None)
    assert [h["state"] for h in inst["history"]] == ["queued"]

    [task] = await kind.daemon().claim(daemon_id="d1", node="n1", capacity=5, wait=0)
    assert task["kind"] == "dockyard" and task["instanceId"] == iid
    assert task["kubeNamespace"] == "jobs" and task["requester"] == inst["requester"]
    assert task["spec"] == {
        "recipe": RECIPE,
        "infra": INFRA,
        "overrides": ["infra.sandbox.replicas=2"],
        "namespace": "jobs",
    }
    # What the daemon will render from it: everything in the provider's namespace, in order.
    manifests = dockyard_task_manifests(
        recipe=task["spec"]["recipe"],
        infra=task["spec"]["infra"],
        overrides=task["spec"]["overrides"],
        namespace=task["spec"]["namespace"],
    )
    assert [m["kind"] for m in manifests] == [
        "Deployment",
        "Service",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "RayJob",
    ]
    assert {m["metadata"]["namespace"] for m in manifests} == {"jobs"}
    assert manifests[0]["spec"]["replicas"] == 2
    status = await kind.user().get_task(task_id=task["taskId"])
    assert status["kind"] == "dockyard" and status["status"] == "leased"


async def test_recipe_with_an_infra_block_and_no_overrides(kind: Queue) -> None:
    iid = await _submit(kind, {"recipe": {**RECIPE, "infra": INFRA}})
    [task] = await kind.daemon().claim(daemon_id="d1", node="n1", capacity=5, wait=0)
    assert task["instanceId"] == iid
    assert task["spec"]["infra"] == {} and task["spec"]["overrides"] == []
    assert task["spec"]["recipe"]["infra"] == INFRA


def _with_a_bad_port(infra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(infra)
    out["sandbox"]["port"] = "not-a-port"
    return out


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({**BODY, "infra": {**INFRA, "colour": "blue"}}, 400, "infra.colour"),
        ({**BODY, "infra": _with_a_bad_port(INFRA)}, 400, "infra.sandbox.port"),
        ({**BODY, "infra": {**INFRA, "namespace": "elsewhere"}}, 400, "infra.namespace"),
        ({**BODY, "overrides": ["infra.launch.mode=sometimes"]}, 400, "infra.launch.mode"),
        ({**BODY, "overrides": ["no-equals-sign"]}, 400, "no-equals-sign"),
        ({**BODY, "recipe": {**RECIPE, "infra": INFRA}}, 400, "infra"),
        ({"infra": INFRA}, 422, "body.recipe"),
        ({**BODY, "recipe": ["a"]}, 422, "body.recipe"),
        ({**BODY, "infra": "x"}, 422, "body.infra"),
        ({**BODY, "overrides": [1]}, 422, "body.overrides"),
        ({**BODY, "colour": 1}, 422, "body.colour"),
    ],
)
async def test_invalid_dockyard_launches_are_refused_before_anything_is_queued(
    kind: Queue, body: dict[str, Any], status: int, needle: str
) -> None:
    r = await kind.call("POST", DOCKYARD, json_body=body)
    assert r.status == status, r.body
    assert needle in r.body["detail"], r.body
    if status == 400:
        assert r.body["error"] == "invalid_dockyard"
    assert (await kind.call("GET", INSTANCES)).body == {"items": []}
    assert await kind.daemon().claim(daemon_id="d1", node="n1", capacity=5, wait=0) == []


async def test_unknown_provider_is_404(kind: Queue) -> None:
    r = await kind.call("POST", NS + "/providers/ghost/dockyard", json_body=BODY)
    assert r.status == 404 and r.body["error"] == "provider_not_found"


async def test_idempotency_key(kind: Queue) -> None:
    first = await _submit(kind, **{"Idempotency-Key": "k-1"})
    again = await _submit(kind, **{"Idempotency-Key": "k-1"})
    assert first == again
    r = await kind.call(
        "POST", DOCKYARD, json_body={**BODY, "overrides": []}, headers={"Idempotency-Key": "k-1"}
    )
    assert r.status == 409 and r.body["error"] == "idempotency_key_reused"
    # A launch body under a key a dockyard launch used is another body, too.
    r = await kind.call(
        "POST",
        NS + "/providers/kind/launch",
        json_body={"mode": "small", "script": "print(1)"},
        headers={"Idempotency-Key": "k-1"},
    )
    assert r.status == 409
    key = {"Idempotency-Key": "k-race"}
    answers = await asyncio.gather(
        *(kind.call("POST", DOCKYARD, json_body=BODY, headers=key) for _ in range(6))
    )
    assert {a.status for a in answers} == {202}
    assert len({a.body["instanceId"] for a in answers}) == 1
    assert len((await kind.call("GET", INSTANCES)).body["items"]) == 2


async def test_client_method(kind: Queue) -> None:
    accepted = await kind.user().launch_dockyard(
        provider="kind", recipe=RECIPE, infra=INFRA, overrides=["infra.sandbox.replicas=3"]
    )
    [task] = await kind.daemon().claim(daemon_id="d1", node="n1", capacity=5, wait=0)
    assert task["instanceId"] == accepted["instanceId"]
    assert task["spec"]["overrides"] == ["infra.sandbox.replicas=3"]


async def test_applied_instance_runs_without_a_node_and_stops_through_its_spec(kind: Queue) -> None:
    iid = await _submit(kind)
    d1, d2 = kind.daemon(), kind.daemon()
    [task] = await d1.claim(daemon_id="d1", node="n1", capacity=5, wait=0)
    # What a daemon reports for a dockyard launch: no node (the objects are not on one).
    await d1.report(
        daemon_id="d1",
        stream="s",
        reports=[
            {"seq": 1, "instanceId": iid, "state": "starting", "message": "applying 5 dockyard objects"},
            {"seq": 2, "instanceId": iid, "state": "running", "message": "5 objects applied"},
        ],
    )
    await kind.user().stop(provider="kind", instance_id=iid)
    # Ordered after the leased dockyard task.
    assert await d2.claim(daemon_id="d2", node="n2", capacity=5, wait=0.2) == []
    done = await d1.complete(daemon_id="d1", task_id=task["taskId"], ok=True, result={"objects": []})
    assert done == {"status": "done"}
    inst = await kind.user().get_instance(provider="kind", instance_id=iid)
    assert inst["node"] is None and inst["state"] == "stopping"
    assert await d1.active(node="n1") == []  # nothing for a restarted daemon to "find missing"
    # Any daemon serving the namespace may take the stop at once; it carries the spec.
    [stop] = await d2.claim(daemon_id="d2", node="n2", capacity=5, wait=0)
    assert stop["kind"] == "stop" and stop["instanceId"] == iid
    assert stop["spec"] == {"dockyard": task["spec"]}
    await d2.complete(daemon_id="d2", task_id=stop["taskId"], ok=True, result={"deleted": []})
    inst = await kind.user().get_instance(provider="kind", instance_id=iid)
    assert (inst["state"], inst["reason"]) == ("stopped", "Stopped")
    assert [h["state"] for h in inst["history"]] == ["queued", "starting", "running", "stopping", "stopped"]


async def test_stop_before_a_daemon_took_it_cancels_it(kind: Queue) -> None:
    iid = await _submit(kind)
    await kind.user().stop(provider="kind", instance_id=iid)
    inst = await kind.user().get_instance(provider="kind", instance_id=iid)
    assert (inst["state"], inst["reason"]) == ("stopped", "Stopped")
    assert await kind.daemon().claim(daemon_id="d1", node="n1", capacity=5, wait=0.2) == []


async def test_permanent_failure_fails_the_launch_and_transient_ones_retry(kind: Queue) -> None:
    iid = await _submit(kind)
    d = kind.daemon()
    [task] = await d.claim(daemon_id="d1", node="n1", capacity=5, wait=0)
    answer = await d.complete(
        daemon_id="d1", task_id=task["taskId"], ok=False, error="Deployment/x: Unavailable", retryable=True
    )
    assert answer["status"] == "requeued"
    [again] = await d.claim(daemon_id="d1", node="n1", capacity=5, wait=5)
    assert again["taskId"] == task["taskId"] and again["attempt"] == 2
    message = "RayJob/x: Forbidden: rayjobs.ray.io is forbidden"
    assert (await d.complete(daemon_id="d1", task_id=task["taskId"], ok=False, error=message))[
        "status"
    ] == "failed"
    inst = await kind.user().get_instance(provider="kind", instance_id=iid)
    assert (inst["state"], inst["reason"], inst["message"]) == ("stopped", "LaunchFailed", message)
    # Stopping a failed instance is a no-op: no stop task.
    await kind.user().stop(provider="kind", instance_id=iid)
    assert await d.claim(daemon_id="d1", node="n1", capacity=5, wait=0) == []


async def test_a_dockyard_task_whose_daemons_keep_dying_is_given_up(
    kind: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nymph.queue.sql import retire as leases

    monkeypatch.setattr(leases, "MAX_DELIVERIES", 2)
    iid = await _submit(kind)
    d = kind.daemon()
    for i in range(2):
        got = await d.claim(daemon_id=f"dies-{i}", node="n1", capacity=1, wait=2, lease_seconds=1)
        assert len(got) == 1
        await asyncio.sleep(1.1)
    assert await d.claim(daemon_id="last", node="n1", capacity=1, wait=0) == []
    inst = await kind.user().get_instance(provider="kind", instance_id=iid)
    assert (inst["state"], inst["reason"]) == ("stopped", "LaunchFailed")


async def test_absurd_nesting_is_a_400_not_a_500(kind: Queue) -> None:
    deep: dict[str, Any] = {}
    cur = deep
    for _ in range(700):
        cur["a"] = {}
        cur = cur["a"]
    r = await kind.call("POST", DOCKYARD, json_body={**BODY, "recipe": {**RECIPE, "deep": deep}})
    assert r.status == 400 and "nested too deep" in r.body["detail"]
