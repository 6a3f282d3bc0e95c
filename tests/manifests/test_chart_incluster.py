"""The Helm chart installed INTO the local cluster's real node, in the image built here: a launch
runs through the chart's queue and daemon to Completed; ``helm upgrade`` with a changed value
rolls the DaemonSet while a launch runs, and that launch still reports its end; a dockyard launch
goes through the in-cluster daemon to a real KubeRay operator and reports its RayJob's end;
``helm uninstall`` leaves nothing behind but what the chart keeps (its namespace and the queue's
claim).

The values are what ``manifests/overlays/local`` changes from the base (no kube-proxy, no cluster
DNS on this node: the queue on the host's network at the node IP). The local cluster runs no
volume binder either, so the test binds the chart's claim to a hostPath volume by hand.
"""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from nymph.dockyard.ownership import LAUNCH_LABEL
from nymph.localcluster import LocalCluster
from nymph.localcluster.kuberay import KubeRayOperator
from tests.support.helm import CHART, Helm, template
from tests.support.incluster import (
    QUEUE_SELECTOR,
    QUEUE_UID,
    SERVED,
    SYSTEM,
    InCluster,
    audit_records,
    connect,
    launch,
    node_root_set_aside,
    teardown,
    wait_namespace_gone,
    wait_state,
)
from tests.support.rayinfra import daemon_infra

pytestmark = [pytest.mark.e2e, pytest.mark.realnode, pytest.mark.timeout(900)]

RELEASE = "nymph"
CLAIM = "nymph-queue-data"
VOLUME = "nymph-chart-test-queue"  # the hostPath PersistentVolume this test binds the claim to
MERGE = "application/merge-patch+json"
NOT_KWOK = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "type", "operator": "NotIn", "values": ["kwok"]}]}
            ]
        }
    }
}
HOST_IP = {"valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}


def local_values(kube: LocalCluster, image: str) -> dict[str, Any]:
    """manifests/overlays/local as chart values: the local image, the queue on the host's network
    at the node IP, the daemon told where it and the API server are, both on the real node."""
    repository, _, tag = image.rpartition(":")
    return {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "daemon": {
            "queueURL": "http://$(NODE_IP):8700",
            "affinity": NOT_KWOK,
            "extraEnv": [
                {"name": "NODE_IP", **HOST_IP},
                {"name": "KUBERNETES_SERVICE_HOST", **HOST_IP},
                {"name": "KUBERNETES_SERVICE_PORT", "value": str(kube.api_port)},
            ],
        },
        "queue": {
            "hostNetwork": True,
            "listenHost": "$(NODE_IP)",
            "affinity": NOT_KWOK,
            "extraEnv": [{"name": "NODE_IP", **HOST_IP}],
            "persistence": {"storageClassName": ""},
        },
    }


def bind_claim_by_hand(kube: LocalCluster, directory: Path) -> None:
    """What the volume binder would do: a hostPath volume for the chart's claim, both bound."""
    path = f"/api/v1/namespaces/{SYSTEM}/persistentvolumeclaims/{CLAIM}"
    claim = kube.api("GET", path)
    size = claim["spec"]["resources"]["requests"]["storage"]
    ref = {"namespace": SYSTEM, "name": CLAIM, "uid": claim["metadata"]["uid"]}
    volume = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": VOLUME},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "",
            "persistentVolumeReclaimPolicy": "Retain",
            "hostPath": {"path": str(directory), "type": "Directory"},
            "claimRef": ref,
        },
    }
    kube.api("POST", "/api/v1/persistentvolumes", volume)
    bound = {"annotations": {"pv.kubernetes.io/bind-completed": "yes"}}
    kube.api("PATCH", path, {"metadata": bound, "spec": {"volumeName": VOLUME}}, content_type=MERGE)
    status = {"phase": "Bound", "accessModes": ["ReadWriteOnce"], "capacity": {"storage": size}}
    kube.api("PATCH", f"{path}/status", {"status": status}, content_type=MERGE)


def remove_volume(kube: LocalCluster) -> None:
    # no binder releases it, so its protection finalizer would hold it for ever
    kube.kubectl("patch", "pv", VOLUME, "--type=merge", "-p", '{"metadata":{"finalizers":null}}', check=False)
    kube.kubectl("delete", "pv", VOLUME, "--ignore-not-found", "--wait=false", check=False)


@dataclass
class Release:
    ic: InCluster
    helm: Helm
    data: Path  # the directory behind the queue's claim


@pytest.fixture(scope="module")
def release(
    real_kube: LocalCluster, helm: Path, nymph_image_on_node: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Release]:
    kube = real_kube
    assert kube.real_node is not None
    work = tmp_path_factory.mktemp("chart")
    data = work / "queue-data"
    data.mkdir()
    os.chown(data, QUEUE_UID, QUEUE_UID)
    values = work / "local-values.yaml"
    values.write_text(yaml.safe_dump(local_values(kube, nymph_image_on_node)))
    docs = template(helm, "-f", str(values))  # what the release makes, to take down on failure
    run = Helm(helm, kube.kubeconfig, work / "helm")
    wait_namespace_gone(kube)  # an earlier deployment in this session may still be going
    with node_root_set_aside():
        try:
            run("install", RELEASE, str(CHART), "--namespace", SERVED, "-f", str(values))
            bind_claim_by_hand(kube, data)
            secret = kube.api("GET", f"/api/v1/namespaces/{SYSTEM}/secrets/nymph-daemon-token")
            token = base64.b64decode(secret["data"]["token"]).decode()
            yield Release(connect(kube, daemon_token=token), run, data)
        finally:
            run("uninstall", RELEASE, "--namespace", SERVED, "--ignore-not-found", check=False)
            teardown(kube, docs, kube.real_node)
            remove_volume(kube)


SCRIPT = 'import os\nprint("hello from", os.environ["NYMPH_INSTANCE_ID"])\n'
SLOW = 'import time\ntime.sleep(10)\nprint("done")\n'


async def test_a_launch_runs_to_completed_through_the_charts_queue_and_daemon(release: Release) -> None:
    ic = release.ic
    iid = await launch(ic, SCRIPT)
    inst = await wait_state(ic, iid, {"stopped"})
    assert inst["reason"] == "Completed", ic.explain(inst)
    assert ic.logs(iid) == f"hello from {iid}\n"
    assert (release.data / "queue.db").is_file()  # the queue's database is on the chart's claim


def queue_pod(ic: InCluster) -> dict[str, Any]:
    [pod] = ic.pods(SYSTEM, QUEUE_SELECTOR)
    return pod


async def test_an_upgrade_rolls_the_daemon_and_a_running_launch_still_reports_its_end(
    release: Release,
) -> None:
    ic = release.ic
    running = await launch(ic, SLOW)
    await wait_state(ic, running, {"running"})
    pod_uid = ic.kube.api("GET", f"/api/v1/namespaces/{SERVED}/pods/{running}")["metadata"]["uid"]
    old = ic.daemon_pod()
    queue_before = queue_pod(ic)["metadata"]["uid"]
    token_path = f"/api/v1/namespaces/{SYSTEM}/secrets/nymph-daemon-token"
    token_version = ic.kube.api("GET", token_path)["metadata"]["resourceVersion"]

    upgrade = ("upgrade", RELEASE, str(CHART), "--namespace", SERVED, "--reuse-values")
    await asyncio.to_thread(release.helm, *upgrade, "--set=daemon.resources.limits.memory=384Mi")
    new = await asyncio.to_thread(ic.daemon_pod, not_uid=old["metadata"]["uid"], timeout=180)
    assert new["spec"]["containers"][0]["resources"]["limits"]["memory"] == "384Mi"

    inst = await wait_state(ic, running, {"stopped"}, timeout=180)
    assert inst["reason"] == "Completed", ic.explain(inst)
    assert ic.logs(running) == "done\n"
    again = ic.kube.api("GET", f"/api/v1/namespaces/{SERVED}/pods/{running}")
    assert again["metadata"]["uid"] == pod_uid, "the running launch kept its one Pod"
    applied = [r["instance"] for r in audit_records() if r["action"] == "apply" and r.get("result") == "ok"]
    assert applied.count(running) == 1
    # nothing else moved: the same queue Pod, the same daemon token (the chart read it back)
    assert queue_pod(ic)["metadata"]["uid"] == queue_before
    assert ic.kube.api("GET", token_path)["metadata"]["resourceVersion"] == token_version
    after = await launch(ic, SCRIPT)
    assert (await wait_state(ic, after, {"stopped"}))["reason"] == "Completed"


async def test_a_dockyard_launch_through_the_in_cluster_daemon_reports_its_rayjobs_end(
    release: Release, kuberay_operator: KubeRayOperator
) -> None:
    """Through the chart's queue and its in-cluster daemon (holding exactly the chart's Pod and
    dockyard Roles), against a real KubeRay operator: ``nymph stop`` of a running dockyard launch
    deletes its RayJob and the operator takes its Ray Pods away; a launch whose entrypoint exits 3
    ends ``stopped`` / Error with KubeRay's message, its sandbox pool deleted."""
    ic = release.ic
    recipe = {"grpo": {"max_num_steps": 1}}

    async def launch_ray(name: str, entrypoint: str) -> str:
        async with ic.client() as c:
            accepted = await c.launch_dockyard(
                provider="local", recipe=recipe, infra=daemon_infra(ic.node, name=name, entrypoint=entrypoint)
            )
        return str(accepted["instanceId"])

    def ray_pods(prefix: str) -> list[str]:
        pods = ic.pods(SERVED, "ray.io%2Fcluster")
        return [p["metadata"]["name"] for p in pods if p["metadata"]["name"].startswith(f"{prefix}-")]

    try:
        long = await launch_ray("long", 'python -c "import time; time.sleep(600)"')
        await wait_state(ic, long, {"running"})
        deadline = asyncio.get_running_loop().time() + 120
        while not ray_pods("long"):  # the operator has made its Ray cluster
            assert asyncio.get_running_loop().time() < deadline, "no head Pod for the running launch"
            await asyncio.sleep(0.5)
        async with ic.client() as c:
            await c.stop(provider="local", instance_id=long)
        assert (await wait_state(ic, long, {"stopped"}))["reason"] == "Stopped"
        deadline = asyncio.get_running_loop().time() + 120
        while ray_pods("long"):
            assert asyncio.get_running_loop().time() < deadline, (
                f"the stopped launch's Ray Pods stay: {ray_pods('long')}"
            )
            await asyncio.sleep(0.5)

        bad = await launch_ray("bad", 'python -c "import sys; sys.exit(3)"')
        got = await wait_state(ic, bad, {"stopped"}, timeout=400)
        assert got["reason"] == "Error", ic.explain(got)
        assert got["message"].startswith("RayJob bad failed (job FAILED): "), got
        pools = {
            d["metadata"]["name"]
            for d in ic.kube.api("GET", f"/apis/apps/v1/namespaces/{SERVED}/deployments")["items"]
        }
        assert "bad-sbx" not in pools, pools
        applied = {
            r["instance"] for r in audit_records() if r["action"] == "apply" and r.get("result") == "ok"
        }
        assert {long, bad} <= applied, "the in-cluster daemon applied both (its audit log on the node)"
    finally:  # what a finished RayJob keeps until KubeRay's TTL: not left for the next tests
        ic.kube.kubectl(
            "delete", "rayjobs.ray.io", "-n", SERVED, "-l", LAUNCH_LABEL, "--wait=false", check=False
        )


def existing(kube: LocalCluster, docs: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """Which of these objects the API server still has (kind, namespace, name)."""
    found = []
    for d in docs:
        group = d["apiVersion"].rpartition("/")[0]
        kind = f"{d['kind'].lower()}.{group}" if group else d["kind"].lower()
        meta = d["metadata"]
        ns = ["-n", meta["namespace"]] if "namespace" in meta else []
        out = kube.kubectl("get", kind, meta["name"], *ns, "--ignore-not-found", "-o", "name", check=False)
        if out.stdout.strip():
            found.append((d["kind"], meta.get("namespace", ""), meta["name"]))
    return found


def test_uninstall_leaves_only_the_namespace_and_the_queue_claim(release: Release) -> None:
    ic, run = release.ic, release.helm
    manifest = run("get", "manifest", RELEASE, "--namespace", SERVED).stdout
    docs = [d for d in yaml.safe_load_all(manifest) if d]
    assert len(existing(ic.kube, docs)) == len(docs)
    run("uninstall", RELEASE, "--namespace", SERVED, "--cascade=foreground", "--wait", "--timeout=180s")
    assert sorted(existing(ic.kube, docs)) == [
        ("Namespace", "", SYSTEM),
        ("PersistentVolumeClaim", SYSTEM, CLAIM),
    ]
    assert run("status", RELEASE, "--namespace", SERVED, check=False).returncode != 0  # no release record
    assert not ic.kube.api("GET", f"/api/v1/namespaces/{SYSTEM}/pods")["items"]  # queue and daemons gone too
    claim = ic.kube.api("GET", f"/api/v1/namespaces/{SYSTEM}/persistentvolumeclaims/{CLAIM}")
    assert claim["spec"]["volumeName"] == VOLUME and (release.data / "queue.db").is_file()
