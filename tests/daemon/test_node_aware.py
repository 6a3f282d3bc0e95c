"""Node-aware claims against the real API server: two kwok nodes with different labels, taints
and capacity, one daemon on each (each reads its own Node with the read-only node ClusterRole);
launches with mixed node selectors, tolerations and requests all land on a matching node and
none turns Unschedulable; a launch no node can run stays queued and says why."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from nymph.client import QueueClient
from nymph.errors import NymphError
from nymph.localcluster import LocalCluster
from nymph.localcluster.flags import KWOK_NODE_ANNOTATION
from tests.support.harness import REPO, DaemonProc, QueueProc, daemon_kubeconfig, running, setup_provider

pytestmark = pytest.mark.e2e

NODE_READER = REPO / "manifests" / "base" / "daemon-node-reader.yaml"
RBAC = "/apis/rbac.authorization.k8s.io/v1"
TOLERATE_GPU = [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
RUN = {"sim.nymph.io/run": "1s"}
GPU_TAINTS = [{"key": "gpu", "value": "a100", "effect": "NoSchedule"}]


def _node(
    name: str, *, labels: dict[str, str], taints: list[dict[str, str]], alloc: dict[str, str]
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "type": "kwok", **labels},
        },
        "spec": {"taints": taints},
        "status": {"allocatable": dict(alloc, pods="110"), "capacity": dict(alloc, pods="110")},
    }


def _wait_ready(kube: LocalCluster, name: str, taints: list[dict[str, str]], timeout: float = 60) -> None:
    """Wait until Ready, then set the node's taints to exactly ``taints``: the admission plugin
    taints every new node not-ready, and this cluster runs no node lifecycle controller to lift
    it (see LocalCluster._wait_node_ready)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        node = kube.api("GET", f"/api/v1/nodes/{name}")
        conds = node.get("status", {}).get("conditions") or []
        if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds):
            kube.api(
                "PATCH",
                f"/api/v1/nodes/{name}",
                {"spec": {"taints": taints or None}},
                content_type="application/merge-patch+json",
            )
            return
        time.sleep(0.3)
    raise AssertionError(f"node {name} not Ready in {timeout}s")


@pytest.fixture
def two_nodes(kube: LocalCluster) -> Iterator[tuple[str, str]]:
    tag = secrets.token_hex(3)
    cpu, gpu = f"cpu-{tag}", f"gpu-{tag}"
    kube.api(
        "POST",
        "/api/v1/nodes",
        _node(cpu, labels={"pool": "cpu"}, taints=[], alloc={"cpu": "4", "memory": "8Gi"}),
    )
    kube.api(
        "POST",
        "/api/v1/nodes",
        _node(
            gpu,
            labels={"pool": "gpu", "gpu": "a100"},
            taints=GPU_TAINTS,
            alloc={"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "2"},
        ),
    )
    try:
        _wait_ready(kube, cpu, [])
        _wait_ready(kube, gpu, GPU_TAINTS)
        yield cpu, gpu
    finally:
        for name in (cpu, gpu):
            with contextlib.suppress(NymphError):
                kube.api("DELETE", f"/api/v1/nodes/{name}")


@pytest.fixture
def node_reader(kube: LocalCluster, namespace: str) -> Iterator[None]:
    """The manifest's node ClusterRole (under a per-test name), bound to the test's daemon SA."""
    role, binding = yaml.safe_load_all(NODE_READER.read_text())
    name = f"nymph-daemon-nodes-{namespace}"
    kube.api("POST", f"{RBAC}/clusterroles", {"metadata": {"name": name}, "rules": role["rules"]})
    kube.api(
        "POST",
        f"{RBAC}/clusterrolebindings",
        {
            "metadata": {"name": name},
            "roleRef": dict(binding["roleRef"], name=name),
            "subjects": [{"kind": "ServiceAccount", "name": "nymph-daemon", "namespace": namespace}],
        },
    )
    try:
        yield
    finally:
        for kind in ("clusterrolebindings", "clusterroles"):
            with contextlib.suppress(NymphError):
                kube.api("DELETE", f"{RBAC}/{kind}/{name}")


# (fields, tolerates the GPU taint, selector pins it to: "cpu" / "gpu" / None)
KINDS: list[tuple[dict[str, Any], str | None]] = [
    ({"node_selector": {"pool": "cpu"}, "resources": {"requests": {"cpu": "2"}}}, "cpu"),
    ({"node_selector": {"gpu": "a100"}, "tolerations": TOLERATE_GPU}, "gpu"),
    ({"tolerations": TOLERATE_GPU, "resources": {"limits": {"nvidia.com/gpu": "1"}}}, "gpu"),
    ({"resources": {"requests": {"cpu": "1500m", "memory": "1Gi"}}}, "cpu"),  # untolerated: cpu only
    ({"tolerations": [{"operator": "Exists"}], "resources": {"requests": {"cpu": "1"}}}, None),
]


async def _launch(c: QueueClient, fields: dict[str, Any]) -> str:
    accepted = await c.launch(provider="local", mode="py", script="print('hi')\n", tags=RUN, fields=fields)
    return str(accepted["instanceId"])


async def test_launches_land_on_matching_nodes(
    kube: LocalCluster, namespace: str, two_nodes: tuple[str, str], node_reader: None, tmp_path: Path
) -> None:
    cpu, gpu = two_nodes
    kc = daemon_kubeconfig(kube, namespace, tmp_path)
    q = QueueProc(tmp_path / "q.db")
    q.tokens()
    q.start()
    daemons = [
        DaemonProc(q, kc, namespace, tmp_path / name, extra=("--node", name, "--concurrency", "8"))
        for name in (cpu, gpu)
    ]
    with running(q, *daemons):
        await setup_provider(q, namespace)
        for d in daemons:
            d.start()
        async with q.client() as c:
            expected: dict[str, str | None] = {}
            for i in range(40):
                fields, pinned = KINDS[i % len(KINDS)]
                expected[await _launch(c, fields)] = {"cpu": cpu, "gpu": gpu, None: None}[pinned]
            stuck = await _launch(c, {"node_selector": {"gpu": "h100"}, "tolerations": TOLERATE_GPU})
            done = await _all_stopped(c, set(expected), timeout=120)
            for iid, inst in done.items():
                reasons = {h["reason"] for h in inst["history"]}
                assert "Unschedulable" not in reasons, inst["history"]
                assert inst["reason"] == "Completed", inst
                assert inst["node"] in (cpu, gpu), inst
                if expected[iid] is not None:
                    assert inst["node"] == expected[iid], (iid, inst["node"], expected[iid])
            nodes = {inst["node"] for inst in done.values()}
            assert nodes == {cpu, gpu}
            # The launch nobody can run: still queued, and it says why.
            inst = await _waiting(c, stuck, timeout=30)
            assert inst["state"] == "queued"
            assert inst["waiting"] == "no daemon's node matches node_selector gpu=h100"
            await c.stop(provider="local", instance_id=stuck)


async def _all_stopped(c: QueueClient, ids: set[str], *, timeout: float) -> dict[str, dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        items = {i["instanceId"]: dict(i) for i in await c.list_instances(provider="local")}
        unsched = [i for i in items.values() if i["reason"] == "Unschedulable"]
        assert not unsched, unsched[0]
        left = [iid for iid in ids if items.get(iid, {}).get("state") != "stopped"]
        if not left:
            return {iid: items[iid] for iid in ids}
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(left)} launches not stopped: {[items.get(i) for i in left[:3]]}")
        await asyncio.sleep(1.0)


async def _waiting(c: QueueClient, iid: str, *, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        inst = dict(await c.get_instance(provider="local", instance_id=iid))
        if inst.get("waiting") or time.monotonic() > deadline:
            return inst
        await asyncio.sleep(0.5)
