"""The direct path under a quota, against the real API server (etcd + kube-apiserver + kwok): a
launch the namespace's quota holds back is answered ``queued`` and has no Pod; its Pod is
created by the queue when a running one stops, and one stopped while held never gets a Pod."""

from __future__ import annotations

from typing import Any

import pytest

from nymph.localcluster import LocalCluster
from tests.queue.test_direct import NS, POD_RULES, _pods, _provider, _wait_state, direct_queue
from tests.support.kube_fixtures import SaKubeconfig
from tests.support.queue_helpers import Queue

__all__ = ["direct_queue"]  # the fixture, used by name

pytestmark = pytest.mark.e2e


async def _launch(q: Queue, run: str) -> Any:
    body = {"mode": "held-m", "script": "print('hi')", "tags": {"sim.nymph.io/run": run}}
    r = await q.call("POST", f"{NS}/providers/held/launch", json_body=body)
    assert r.status == 202, r.body
    return r.body


async def test_a_held_direct_launch_is_created_when_room_frees_up(
    kube: LocalCluster, namespace: str, sa_kubeconfig: SaKubeconfig, direct_queue: Queue
) -> None:
    q = direct_queue
    kc = sa_kubeconfig(namespace=namespace, rules=POD_RULES, name="launcher")
    await _provider(q, "held", {"kubeconfig": kc.read_text(), "namespace": namespace})
    r = await q.call("PUT", NS + "/quota", token=q.admin_token, json_body={"maxRunning": 1})
    assert r.status == 200, r.body

    first = await _launch(q, "3s")
    assert first["state"] == "starting"  # room: created at once, the 202 reads the Pod
    second = await _launch(q, "1h")
    third = await _launch(q, "1h")
    assert second["state"] == third["state"] == "queued"
    assert _pods(kube, namespace) == [first["instanceId"]]
    r = await q.call("GET", f"{NS}/providers/held/instances/{second['instanceId']}")
    assert r.body["state"] == "queued" and "held: default at maxRunning 1 of 1" in r.body["message"]

    # stopped while held: no Pod, ever
    r = await q.call("DELETE", f"{NS}/providers/held/instances/{third['instanceId']}")
    assert r.status == 204
    await _wait_state(q, "held", third["instanceId"], "stopped")

    # the first ends: the second's turn comes and the queue creates its Pod
    await _wait_state(q, "held", first["instanceId"], "stopped")
    inst = await _wait_state(q, "held", second["instanceId"], "running")
    assert [h["state"] for h in inst["history"]][:2] == ["queued", "starting"]
    assert third["instanceId"] not in _pods(kube, namespace)
    r = await q.call("GET", NS + "/quota")
    assert r.body["usage"]["running"] == 1
