"""The local control plane is a real Kubernetes API: watches, deletion, RBAC, CRDs."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client, config, watch

from nymph.kube.binaries import kubectl_path
from nymph.launch.state import InstanceState, Reason, pod_reason, pod_state
from nymph.localcluster import LocalCluster
from nymph.localcluster.procs import free_port

pytestmark = pytest.mark.e2e


def bare_pod(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "user", "image": "python:3.12-slim", "command": ["true"]}],
        },
    }


async def api_client(kubeconfig: Path) -> client.ApiClient:
    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    return client.ApiClient(configuration=cfg)


async def watch_pod(
    kubeconfig: Path, namespace: str, name: str, *, until: Any, timeout: float = 30
) -> list[tuple[str, dict[str, Any]]]:
    """Collect (event type, raw pod) for one pod until ``until(events)`` is true."""
    events: list[tuple[str, dict[str, Any]]] = []
    async with await api_client(kubeconfig) as api:
        v1 = client.CoreV1Api(api)
        w = watch.Watch()

        async def run() -> None:
            async for ev in w.stream(
                v1.list_namespaced_pod,
                namespace=namespace,
                field_selector=f"metadata.name={name}",
                timeout_seconds=int(timeout),
            ):
                events.append((ev["type"], ev["raw_object"]))
                if until(events):
                    w.stop()
                    return

        await asyncio.wait_for(run(), timeout)
    return events


async def test_pod_goes_pending_running_succeeded_through_a_watch(kube: LocalCluster, namespace: str) -> None:
    kube.api("POST", f"/api/v1/namespaces/{namespace}/pods", bare_pod("ok", {"sim.nymph.io/run": "1s"}))
    events = await watch_pod(
        kube.kubeconfig, namespace, "ok", until=lambda evs: evs[-1][1]["status"].get("phase") == "Succeeded"
    )
    states = [pod_state(p) for _, p in events]
    # De-duplicate consecutive repeats: the watch sees every status write.
    seen = [s for i, s in enumerate(states) if i == 0 or s != states[i - 1]]
    assert seen == [InstanceState.STARTING, InstanceState.RUNNING, InstanceState.STOPPED]
    assert pod_reason(events[-1][1])[0] is Reason.COMPLETED
    assert events[-1][1]["spec"]["nodeName"] == "nymph-node-1"


@pytest.mark.parametrize(
    ("outcome", "reason", "final_phase"),
    [
        ("fail", Reason.ERROR, "Failed"),
        ("oom", Reason.OOM_KILLED, "Failed"),
        ("image-pull", Reason.IMAGE_PULL, "Pending"),
    ],
)
async def test_simulated_failures_map_to_the_taxonomy(
    kube: LocalCluster, namespace: str, outcome: str, reason: Reason, final_phase: str
) -> None:
    kube.api("POST", f"/api/v1/namespaces/{namespace}/pods", bare_pod("p", {"sim.nymph.io/outcome": outcome}))
    events = await watch_pod(
        kube.kubeconfig, namespace, "p", until=lambda evs: pod_reason(evs[-1][1])[0] is not None
    )
    last = events[-1][1]
    assert last["status"]["phase"] == final_phase
    assert pod_reason(last)[0] is reason


async def test_unschedulable_pod_reports_unschedulable(kube: LocalCluster, namespace: str) -> None:
    pod = bare_pod("nowhere")
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "no-such-node"}
    kube.api("POST", f"/api/v1/namespaces/{namespace}/pods", pod)
    events = await watch_pod(
        kube.kubeconfig, namespace, "nowhere", until=lambda evs: pod_reason(evs[-1][1])[0] is not None
    )
    reason, message = pod_reason(events[-1][1])
    assert reason is Reason.UNSCHEDULABLE
    assert "node" in message


async def test_deleted_bound_pod_shows_deletion_timestamp_before_it_disappears(
    kube: LocalCluster, namespace: str
) -> None:
    kube.api("POST", f"/api/v1/namespaces/{namespace}/pods", bare_pod("long", {"sim.nymph.io/run": "1h"}))
    await watch_pod(
        kube.kubeconfig, namespace, "long", until=lambda evs: evs[-1][1]["status"].get("phase") == "Running"
    )

    async def delete_soon() -> None:
        await asyncio.sleep(0.3)
        await asyncio.to_thread(kube.api, "DELETE", f"/api/v1/namespaces/{namespace}/pods/long")

    task = asyncio.create_task(delete_soon())
    events = await watch_pod(kube.kubeconfig, namespace, "long", until=lambda evs: evs[-1][0] == "DELETED")
    await task
    types = [t for t, _ in events]
    stopping = [i for i, (_, p) in enumerate(events) if pod_state(p) is InstanceState.STOPPING]
    assert stopping, "no event carried a deletionTimestamp"
    assert types[-1] == "DELETED"
    assert stopping[0] < len(events) - 1


def test_service_account_without_create_pods_is_forbidden(
    kube: LocalCluster, namespace: str, sa_kubeconfig: Any
) -> None:
    kc = sa_kubeconfig(
        namespace=namespace,
        rules=[{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
        name="reader",
    )
    manifest = json.dumps(bare_pod("denied"))
    proc = subprocess.run(
        [kubectl_path(), f"--kubeconfig={kc}", "-n", namespace, "create", "-f", "-"],
        input=manifest,
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0
    assert "forbidden" in proc.stderr.lower()
    # Positive control: the same identity may list pods.
    ok = subprocess.run(
        [kubectl_path(), f"--kubeconfig={kc}", "-n", namespace, "get", "pods"], capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stderr


def test_service_account_with_create_pods_is_allowed(
    kube: LocalCluster, namespace: str, sa_kubeconfig: Any
) -> None:
    kc = sa_kubeconfig(
        namespace=namespace,
        rules=[{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}],
        name="creator",
    )
    proc = subprocess.run(
        [kubectl_path(), f"--kubeconfig={kc}", "-n", namespace, "create", "-f", "-"],
        input=json.dumps(bare_pod("allowed")),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr


def _rayjob(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": name},
        "spec": {
            "entrypoint": "python -c 'print(1)'",
            "rayClusterSpec": {
                "headGroupSpec": {
                    "rayStartParams": {},
                    "template": {
                        "spec": {"containers": [{"name": "ray-head", "image": "rayproject/ray:2.40.0"}]}
                    },
                },
                "workerGroupSpecs": [
                    {
                        "groupName": "trainer",
                        "replicas": 1,
                        "minReplicas": 1,
                        "maxReplicas": 1,
                        "rayStartParams": {},
                        "template": {
                            "spec": {"containers": [{"name": "ray-worker", "image": "rayproject/ray:2.40.0"}]}
                        },
                    }
                ],
            },
        },
    }


def test_kuberay_rayjob_validates_server_side(kube: LocalCluster, namespace: str, kuberay_crds: Path) -> None:
    good = kube.kubectl(
        "apply",
        "--dry-run=server",
        "-n",
        namespace,
        "-f",
        "-",
        input=json.dumps(_rayjob("good")),
        check=False,
    )
    assert good.returncode == 0, good.stderr
    bad = _rayjob("bad")
    bad["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] = "many"
    bad["spec"]["shutdownAfterJobFinishes"] = "yes-please"
    res = kube.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(bad), check=False
    )
    assert res.returncode != 0
    assert "invalid" in res.stderr.lower()


def test_rendered_spec_example_is_accepted_by_the_api_server(kube: LocalCluster, tmp_path: Path) -> None:
    from tests.cli.test_render import SPEC_DREAMRC

    (tmp_path / ".dreamrc").write_text(SPEC_DREAMRC)
    (tmp_path / "train.py").write_text("print('hello from nymph')\n")
    kube.api("POST", "/api/v1/namespaces", {"metadata": {"name": "lakeshore"}})
    kube.wait_default_sa("lakeshore")
    rendered = subprocess.run(
        [
            sys.executable,
            "-m",
            "nymph.cli",
            "render",
            "--dreamrc",
            str(tmp_path / ".dreamrc"),
            "--mode",
            "k8s-gpu",
            "--script",
            str(tmp_path / "train.py"),
            "--tag",
            "team=ml",
            "--node",
            "nymph-node-1",
            "--workdir-root",
            "/var/lib/nymph",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    client_side = kube.kubectl("apply", "--dry-run=client", "-f", "-", input=rendered, check=False)
    assert client_side.returncode == 0, client_side.stderr
    res = kube.kubectl(
        "apply",
        "--server-side",
        "--field-manager=nymph",
        "--dry-run=server",
        "-f",
        "-",
        input=rendered,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert "lakeshore-" in res.stdout
    assert yaml.safe_load(rendered)["metadata"]["namespace"] == "lakeshore"


def test_stop_leaves_no_process_behind(tmp_path: Path, kube: LocalCluster) -> None:
    # A second, small cluster (no controller manager) so the session one keeps running.
    small = LocalCluster(tmp_path / "c2", assets=None, controller_manager=False)
    small.start()
    pids = [p.popen.pid for p in small.procs]
    assert len(pids) == 4
    small.stop()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_free_port_never_hands_out_a_port_twice_in_a_row_of_listeners() -> None:
    """Ports picked one after the other for the listeners of one start are all different, even
    though each is released before the next is picked (the kernel may offer it again)."""
    ports = [free_port() for _ in range(400)]
    assert len(set(ports)) == len(ports)
    assert all(1024 < p < 65536 for p in ports)
