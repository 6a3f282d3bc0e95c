"""A daemon follows its own node's Pods only (selected by their node label, so a Pod's changes
reach one daemon, not every daemon of the cluster), and Pods an older daemon rendered without
that label are given it before the watch starts, never a Pod nymph did not render."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from nymph.daemon.nodelabels import label_node_pods
from nymph.kube.api import make_api_client
from nymph.kube.watch import PodWatcher
from nymph.launch.config import Mode, Provider
from nymph.launch.names import LABEL_NODE, node_selector
from nymph.launch.render import render_pod
from nymph.launch.spec import build_launch_spec
from nymph.localcluster import LocalCluster

pytestmark = pytest.mark.e2e


def _rendered(namespace: str, iid: str, node: str, *, legacy: bool = False) -> dict[str, Any]:
    spec = build_launch_spec(
        provider=Provider(name="p", kwargs={"namespace": namespace}),
        mode=Mode(name="m", fields={"image": "busybox"}),
        body={"script": "true"},
        instance_id=iid,
        owner_namespace="team-a",
    )
    pod = dict(render_pod(spec, node=node))
    pod["metadata"]["annotations"] = {**pod["metadata"]["annotations"], "nymph.io/launch": "{}"}
    if legacy:  # as a daemon rendered it before Pods carried their node
        del pod["metadata"]["labels"][LABEL_NODE]
    return pod


def _labels(kube: LocalCluster, namespace: str, name: str) -> dict[str, str]:
    return dict(
        kube.api("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")["metadata"].get("labels") or {}
    )


async def test_a_daemon_watch_sees_its_own_nodes_pods_only(kube: LocalCluster, namespace: str) -> None:
    for iid, node in (("lakeshore-0000000a", "node-a"), ("lakeshore-0000000b", "node-b")):
        kube.api("POST", f"/api/v1/namespaces/{namespace}/pods", _rendered(namespace, iid, node))
    api = await make_api_client(kubeconfig=str(kube.kubeconfig))
    seen: list[tuple[str, str]] = []
    first = asyncio.Event()
    touched = asyncio.Event()

    async def on_event(kind: str, pod: dict[str, Any]) -> None:
        seen.append((kind, pod["metadata"]["name"]))
        first.set()
        if (pod["metadata"].get("labels") or {}).get("touched") and pod["metadata"]["name"].endswith("a"):
            touched.set()

    watcher = PodWatcher(
        api=api, namespace=namespace, label_selector=node_selector("node-a"), on_event=on_event
    )
    task = asyncio.create_task(watcher.run())
    try:
        await asyncio.wait_for(first.wait(), 20)
        # a change to the other node's Pod, then one to this node's: only the latter arrives
        for iid in ("lakeshore-0000000b", "lakeshore-0000000a"):
            kube.api(
                "PATCH",
                f"/api/v1/namespaces/{namespace}/pods/{iid}",
                {"metadata": {"labels": {"touched": "yes"}}},
                content_type="application/merge-patch+json",
            )
        await asyncio.wait_for(touched.wait(), 20)
        assert {name for _, name in seen} == {"lakeshore-0000000a"}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api.close()


async def test_pods_of_an_older_daemon_get_their_node_label_and_no_other_pod_is_changed(
    kube: LocalCluster, namespace: str
) -> None:
    pods = {
        "lakeshore-0000000a": _rendered(namespace, "lakeshore-0000000a", "node-a", legacy=True),
        "lakeshore-0000000b": _rendered(namespace, "lakeshore-0000000b", "node-b", legacy=True),
        "lakeshore-0000000c": _rendered(namespace, "lakeshore-0000000c", "node-a"),
    }
    # nymph's label, on this node, but not rendered by a daemon (no launch annotation)
    foreign = _rendered(namespace, "lakeshore-0000000f", "node-a", legacy=True)
    del foreign["metadata"]["annotations"]["nymph.io/launch"]
    pods["lakeshore-0000000f"] = foreign
    for pod in pods.values():
        kube.api("POST", f"/api/v1/namespaces/{namespace}/pods", pod)
    before = {name: _labels(kube, namespace, name) for name in pods}
    api = await make_api_client(kubeconfig=str(kube.kubeconfig))
    try:
        assert await label_node_pods(api, namespace=namespace, node="node-a") == 1
        assert await label_node_pods(api, namespace=namespace, node="node-a") == 0  # done once
    finally:
        await api.close()
    after = {name: _labels(kube, namespace, name) for name in pods}
    assert after["lakeshore-0000000a"] == {**before["lakeshore-0000000a"], LABEL_NODE: "node-a"}
    for name in ("lakeshore-0000000b", "lakeshore-0000000c", "lakeshore-0000000f"):
        assert after[name] == before[name], name
