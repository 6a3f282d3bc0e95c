"""Deploying nymph into the local cluster's real node for tests/manifests/test_incluster.py: the
local overlay rendered for one cluster, applied and torn down; the node's /var/lib/nymph set
aside meanwhile; the queue reached from the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from nymph.client import QueueClient
from nymph.localcluster import LocalCluster
from nymph.localcluster.cluster import kubectl_path

REPO = Path(__file__).resolve().parents[2]
NODE_ROOT = Path("/var/lib/nymph")
LOCK = Path("/run/nymph-incluster.lock")
SYSTEM = "nymph-system"
SERVED = "default"  # the namespace the shipped daemon serves
QUEUE_UID = 10001
DAEMON_SELECTOR = "app.kubernetes.io/component%3Ddaemon"
QUEUE_SELECTOR = "app.kubernetes.io/component%3Dqueue"


def kustomize(path: Path) -> list[dict[str, Any]]:
    out = subprocess.run(
        [kubectl_path(), "kustomize", str(path)], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def one_of(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


@contextlib.contextmanager
def node_root_set_aside() -> Iterator[None]:
    """A fresh /var/lib/nymph for the daemon; whatever was there comes back afterwards."""
    with LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for stale in sorted(NODE_ROOT.parent.glob("nymph.set-aside-*")):
            # a run killed before it could put the original back: what is there now is its own
            shutil.rmtree(NODE_ROOT, ignore_errors=True)
            os.rename(stale, NODE_ROOT)
            break  # runs take turns under the lock: there is at most one
        saved = NODE_ROOT.with_name(f"nymph.set-aside-{os.getpid()}")
        had = NODE_ROOT.exists()
        if had:
            os.rename(NODE_ROOT, saved)
        try:
            yield
        finally:
            shutil.rmtree(NODE_ROOT, ignore_errors=True)
            if had:
                os.rename(saved, NODE_ROOT)


@dataclass
class InCluster:
    kube: LocalCluster
    node: str
    url: str
    user_token: str = field(repr=False)
    daemon_token: str = field(repr=False)

    def client(self) -> QueueClient:
        return QueueClient(base_url=self.url, token=self.user_token)

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        got = self.kube.api("GET", f"/api/v1/namespaces/{namespace}/pods?labelSelector={selector}")
        return list(got["items"])

    def daemon_pod(self, *, timeout: float = 120, not_uid: str | None = None) -> dict[str, Any]:
        """The daemon Pod on the real node once it is Ready (another one than ``not_uid``)."""
        return wait_ready(self, SYSTEM, DAEMON_SELECTOR, node=self.node, not_uid=not_uid, timeout=timeout)

    def logs(self, pod: str, namespace: str = SERVED) -> str:
        return self.kube.kubectl("logs", "-n", namespace, pod).stdout

    def explain(self, inst: dict[str, Any]) -> str:
        """A failed launch's message and history, and the daemon's last log lines."""
        logs = self.kube.kubectl(
            "logs", "-n", SYSTEM, "-l", "app.kubernetes.io/component=daemon", "--tail=30", check=False
        )
        return f"{inst.get('reason')}: {inst.get('message')}\n{inst.get('history')}\n{logs.stdout[-6000:]}"

    def exec_daemon(self, *cmd: str) -> subprocess.CompletedProcess[str]:
        pod = self.daemon_pod()["metadata"]["name"]
        return self.kube.kubectl("exec", "-n", SYSTEM, pod, "-c", "daemon", "--", *cmd, check=False)


def _ready(pod: dict[str, Any]) -> bool:
    conds = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def wait_ready(
    ic: InCluster, namespace: str, selector: str, *, node: str, not_uid: str | None = None, timeout: float
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    seen: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        seen = [p for p in ic.pods(namespace, selector) if p["spec"].get("nodeName") == node]
        for p in seen:
            if _ready(p) and not p["metadata"].get("deletionTimestamp") and p["metadata"]["uid"] != not_uid:
                return p
        time.sleep(0.2)
    states = [(p["metadata"]["name"], p.get("status", {}).get("containerStatuses")) for p in seen]
    raise AssertionError(f"no Ready pod for {selector} on {node} in {timeout}s: {states}")


def render(kube: LocalCluster, queue_data: Path) -> list[dict[str, Any]]:
    """The local overlay for this cluster: the queue's data in this run's directory, and the
    API server's port if it is not 443."""
    docs = kustomize(REPO / "manifests" / "overlays" / "local")
    volumes = one_of(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    next(v for v in volumes if v["name"] == "data")["hostPath"]["path"] = str(queue_data)
    env = one_of(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["env"]
    next(e for e in env if e["name"] == "KUBERNETES_SERVICE_PORT")["value"] = str(kube.api_port)
    return docs


def apply(kube: LocalCluster, docs: list[dict[str, Any]]) -> None:
    kube.kubectl(
        "apply", "--server-side", "--field-manager=nymph-tests", "-f", "-", input=yaml.safe_dump_all(docs)
    )


def teardown(kube: LocalCluster, docs: list[dict[str, Any]], node: str) -> None:
    for kind, name in (("daemonset", "nymph-daemon"), ("deployment", "nymph-queue")):
        kube.kubectl("delete", "-n", SYSTEM, kind, name, "--ignore-not-found", "--wait=false", check=False)
    kube.kubectl("delete", "pods", "-n", SERVED, "-l", "lakeshore=true", "--grace-period=1", check=False)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:  # the daemon's hostPath is removed after: let go of it
        left = kube.api("GET", f"/api/v1/namespaces/{SYSTEM}/pods")["items"]
        if not [p for p in left if p["spec"].get("nodeName") == node]:
            break
        time.sleep(0.5)
    kube.kubectl("delete", "namespace", SYSTEM, "--wait=false", check=False)
    for d in docs:
        if d["kind"] in ("Role", "RoleBinding") and d["metadata"].get("namespace") == SERVED:
            kube.kubectl("delete", d["kind"].lower(), "-n", SERVED, d["metadata"]["name"], check=False)
        if d["kind"] in ("ClusterRole", "ClusterRoleBinding"):  # the daemon's node reader
            kube.kubectl("delete", d["kind"].lower(), d["metadata"]["name"], check=False)


def wait_namespace_gone(kube: LocalCluster, timeout: float = 120) -> None:
    """Until nymph-system is deleted for good (teardown does not wait for it), so that a deployment
    can make it afresh."""
    deadline = time.monotonic() + timeout
    while kube.kubectl(
        "get", "namespace", SYSTEM, "--ignore-not-found", "-o", "name", check=False
    ).stdout.strip():
        if time.monotonic() > deadline:
            raise AssertionError(f"namespace {SYSTEM} still there after {timeout}s")
        time.sleep(0.5)


def connect(kube: LocalCluster, *, daemon_token: str) -> InCluster:
    """The deployed queue and daemon, once both are Ready on the real node, with a user token
    (made in the queue Pod) and the provider ``local`` / mode ``py`` (the local python image)
    serving the namespace the daemon serves."""
    node = kube.real_node
    assert node is not None and kube.real is not None
    python = next(i for i in kube.node_image_names if "/python:" in i)
    ic = InCluster(kube, node, f"http://{kube.real.node_ip}:8700", "", daemon_token)
    queue_pod = wait_ready(ic, SYSTEM, QUEUE_SELECTOR, node=node, timeout=180)
    out = kube.kubectl(
        "exec",
        "-n",
        SYSTEM,
        queue_pod["metadata"]["name"],
        "--",
        "nymph",
        "queue",
        "token",
        "create",
        "--db=/data/queue.db",
        "--role=user",
    ).stdout
    ic.user_token = out.strip().splitlines()[-1].split()[-1]
    ic.daemon_pod(timeout=180)

    async def setup() -> None:
        async with ic.client() as c:
            await c.create_provider(
                name="local", launcher="Kube", kwargs={"namespace": SERVED}, dispatch="daemon"
            )
            await c.create_mode(name="py", provider="local", fields={"image": python})

    asyncio.run(setup())
    return ic


async def launch(ic: InCluster, script: str) -> str:
    async with ic.client() as c:
        return str((await c.launch(provider="local", mode="py", script=script))["instanceId"])


async def wait_state(ic: InCluster, iid: str, states: set[str], timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    async with ic.client() as c:
        while True:
            inst = dict(await c.get_instance(provider="local", instance_id=iid))
            if inst["state"] in states:
                return inst
            if time.monotonic() >= deadline:
                raise AssertionError(f"{iid} stuck in {inst['state']}: {ic.explain(inst)}")
            await asyncio.sleep(0.3)


def audit_records() -> list[dict[str, Any]]:
    return [json.loads(line) for line in (NODE_ROOT / "audit.jsonl").read_text().splitlines() if line]
