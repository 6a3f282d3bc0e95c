"""nymph deployed INTO the local cluster's real node: the queue as a Deployment and the daemon
as a DaemonSet Pod (``manifests/overlays/local`` over the kustomize base), in the image built
here from ``daemonset/Dockerfile``. A launch sent to the queue from the host is claimed by the
in-cluster daemon, which runs the user's script in a real container.

The daemon's hostPath is the node's /var/lib/nymph, and the node is this machine: while these
tests run, a /var/lib/nymph already there is set aside (and put back after), under a lock so two
runs on one machine take turns.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from nymph.client import QueueClient
from nymph.localcluster import LocalCluster
from nymph.localcluster.cluster import kubectl_path

REPO = Path(__file__).resolve().parents[2]
NODE_ROOT = Path("/var/lib/nymph")
LOCK = Path("/run/nymph-incluster.lock")
SYSTEM = "nymph-system"
# a cold first run builds the python base and the nymph image (several minutes on 2 cores)
pytestmark = pytest.mark.timeout(900)
SERVED = "default"  # the namespace the shipped daemon serves
QUEUE_UID = 10001
DAEMON_SELECTOR = "app.kubernetes.io/component%3Ddaemon"
QUEUE_SELECTOR = "app.kubernetes.io/component%3Dqueue"


def kustomize(path: Path) -> list[dict[str, Any]]:
    out = subprocess.run(
        [kubectl_path(), "kustomize", str(path)], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def _one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


# --- the overlay itself (no cluster needed) ---------------------------------------------------


def test_local_overlay_keeps_the_daemon_as_shipped() -> None:
    base = kustomize(REPO / "manifests" / "base")
    local = kustomize(REPO / "manifests" / "overlays" / "local")
    for kind in ("Namespace", "ServiceAccount", "Role", "RoleBinding", "Service"):
        assert [d for d in local if d["kind"] == kind] == [d for d in base if d["kind"] == kind], kind
    b_ds, l_ds = _one(base, "DaemonSet"), _one(local, "DaemonSet")
    b_pod, l_pod = b_ds["spec"]["template"]["spec"], l_ds["spec"]["template"]["spec"]
    assert l_pod["serviceAccountName"] == b_pod["serviceAccountName"] == "nymph-daemon"
    assert l_pod["volumes"] == b_pod["volumes"]
    assert {"name": "nymph-root", "hostPath": {"path": "/var/lib/nymph", "type": "DirectoryOrCreate"}} in (
        l_pod["volumes"]
    )
    b_c, l_c = b_pod["containers"][0], l_pod["containers"][0]
    for key in ("volumeMounts", "securityContext", "ports", "livenessProbe", "readinessProbe", "resources"):
        assert l_c[key] == b_c[key], key
    assert l_c["env"][: len(b_c["env"])] == b_c["env"]  # NODE_NAME (downward API), the token Secret
    added = {e["name"]: e for e in l_c["env"][len(b_c["env"]) :]}
    assert set(added) == {"NODE_IP", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"}
    assert added["KUBERNETES_SERVICE_HOST"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
    # only the queue URL differs among the arguments
    assert [a for a in l_c["args"] if not a.startswith("--queue=")] == [
        a for a in b_c["args"] if not a.startswith("--queue=")
    ]
    assert "--queue=http://$(NODE_IP):8700" in l_c["args"]
    queue = _one(local, "Deployment")["spec"]["template"]["spec"]
    assert queue["hostNetwork"] is True
    assert "--listen=$(NODE_IP):8700" in queue["containers"][0]["args"]
    for c in (l_c, queue["containers"][0]):
        assert c["image"] == "nymph.local/nymph:dev" and c["imagePullPolicy"] == "Never"
    # no volume binder in the local cluster: the queue's data is a hostPath directory
    assert not [d for d in local if d["kind"] == "PersistentVolumeClaim"]
    assert queue["volumes"][0] == {
        "name": "data",
        "hostPath": {"path": "/var/lib/nymph-queue", "type": "Directory"},
    }


def _buildah_or_skip() -> None:
    if os.geteuid() == 0 and shutil.which("buildah") and shutil.which("debootstrap"):
        return
    why = "building the nymph image needs root, buildah and debootstrap (tests/envtest/deps.sh)"
    if os.environ.get("NYMPH_E2E", "").strip().lower() == "require":
        pytest.fail(f"NYMPH_E2E=require but {why}", pytrace=False)
    pytest.skip(why)


@pytest.mark.e2e
@pytest.mark.slow
def test_the_nymph_image_built_here_runs(tmp_path: Path) -> None:
    """daemonset/Dockerfile on the local python base: nymph and kubectl run inside it."""
    from nymph.localcluster.imagebuild import ensure_nymph_image

    _buildah_or_skip()
    image = ensure_nymph_image()
    store = ["--root", str(tmp_path / "s"), "--runroot", str(tmp_path / "r"), "--storage-driver", "vfs"]

    def buildah(*args: str) -> str:
        res = subprocess.run(["buildah", *store, *args], capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr
        return res.stdout

    try:
        buildah("pull", "--quiet", f"oci-archive:{image.oci_archive}")
        box = buildah("from", "--pull=never", image.name).strip()
        run = ("run", "--isolation", "chroot", box, "--")
        assert "nymph dispatches jobs" in buildah(*run, "nymph", "--help")
        assert "Client Version: v1.36" in buildah(*run, "kubectl", "version", "--client")
        assert buildah(*run, "id", "-u").strip() == "10001"  # the queue's user, as in the base image
    finally:
        subprocess.run(["buildah", *store, "rm", "--all"], capture_output=True, timeout=120)
        subprocess.run(["buildah", *store, "rmi", "--all", "--force"], capture_output=True, timeout=120)


# --- the deployment on the real node ----------------------------------------------------------


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
    volumes = _one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    next(v for v in volumes if v["name"] == "data")["hostPath"]["path"] = str(queue_data)
    env = _one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["env"]
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


def import_nymph_image(kube: LocalCluster) -> str:
    from nymph.localcluster.imagebuild import ensure_nymph_image
    from nymph.localcluster.images import import_images

    assert kube.real is not None and kube.real.layout is not None
    image = ensure_nymph_image()
    import_images(
        images=[image],
        ctr=kube.real.assets / "ctr",
        address=kube.real.layout.containerd_socket,
        snapshotter="overlayfs",
    )
    return image.name


@pytest.fixture(scope="module")
def incluster(real_kube: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InCluster]:
    kube = real_kube
    node = kube.real_node
    assert node is not None
    import_nymph_image(kube)
    python = next(i for i in kube.node_image_names if "/python:" in i)
    queue_data = tmp_path_factory.mktemp("queue-data")
    os.chown(queue_data, QUEUE_UID, QUEUE_UID)
    docs = render(kube, queue_data)
    daemon_token = f"nyq_{secrets.token_urlsafe(32)}"
    with node_root_set_aside():
        try:
            apply(kube, [d for d in docs if d["kind"] == "Namespace"])
            kube.kubectl(
                "create",
                "secret",
                "generic",
                "nymph-daemon-token",
                "-n",
                SYSTEM,
                "--from-file=token=/dev/stdin",
                input=daemon_token,
            )
            apply(kube, [d for d in docs if d["kind"] != "Namespace"])
            ic = InCluster(kube, node, f"http://{kube.real.node_ip}:8700", "", daemon_token)  # type: ignore[union-attr]
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
                    await c.create_provider(name="local", launcher="Kube", kwargs={"namespace": SERVED})
                    await c.create_mode(name="py", provider="local", fields={"image": python})

            asyncio.run(setup())
            yield ic
        finally:
            teardown(kube, docs, node)


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
            assert time.monotonic() < deadline, f"{iid} stuck in {inst['state']}: {inst.get('history')}"
            await asyncio.sleep(0.3)


def audit_records() -> list[dict[str, Any]]:
    return [json.loads(line) for line in (NODE_ROOT / "audit.jsonl").read_text().splitlines() if line]


SCRIPT = """\
import os, pathlib
iid = os.environ["NYMPH_INSTANCE_ID"]
wd = pathlib.Path(os.environ["NYMPH_WORKDIR"])
(wd / "result.txt").write_text(f"written by {iid}\\n")
print(f"hello from {iid} in {wd}")
"""


@pytest.mark.e2e
async def test_a_launch_runs_for_real_through_the_in_cluster_daemon(incluster: InCluster) -> None:
    iid = await launch(incluster, SCRIPT)
    inst = await wait_state(incluster, iid, {"stopped"})
    assert inst["reason"] == "Completed", incluster.explain(inst)
    assert incluster.logs(iid) == f"hello from {iid} in /workdir\n"
    assert (NODE_ROOT / "work" / iid / "result.txt").read_text() == f"written by {iid}\n"
    pod = incluster.kube.api("GET", f"/api/v1/namespaces/{SERVED}/pods/{iid}")
    assert pod["spec"]["nodeName"] == incluster.node
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    work = next(v for v in pod["spec"]["volumes"] if "hostPath" in v)
    assert work["hostPath"]["path"] == str(NODE_ROOT / "work" / iid)
    daemon = incluster.daemon_pod()
    applied = [r for r in audit_records() if r["action"] == "apply" and r.get("instance") == iid]
    assert [r.get("node") for r in applied] == [daemon["spec"]["nodeName"]]


@pytest.mark.e2e
def test_the_daemon_pod_acts_with_exactly_the_shipped_role(incluster: InCluster) -> None:
    who = incluster.exec_daemon("kubectl", "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}")
    assert who.stdout.strip() == f"system:serviceaccount:{SYSTEM}:nymph-daemon", who.stderr
    role = yaml.safe_load((REPO / "manifests" / "base" / "daemon-role.yaml").read_text())
    allowed = [(v, r) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]]
    allowed += [(v, "deployments.apps") for v in ("get", "create", "patch", "delete")]
    denied = [
        ("get", "secrets"),
        ("list", "configmaps"),
        ("update", "pods"),
        ("create", "pods/exec"),
        ("create", "pods/portforward"),
        ("list", "deployments.apps"),
    ]
    checks = [(v, r, SERVED, "yes") for v, r in allowed] + [(v, r, SERVED, "no") for v, r in denied]
    checks += [
        ("create", "pods", "kube-system", "no"),
        ("get", "secrets", SYSTEM, "no"),
        ("list", "nodes", "", "no"),
    ]

    def can_i(verb: str, resource: str, namespace: str) -> str:
        # "pods/exec" would mean the Pod named exec: a subresource needs its own flag
        res, _, sub = resource.partition("/")
        flags = (f" --subresource={sub}" if sub else "") + (f" -n {namespace}" if namespace else "")
        return f"kubectl auth can-i {verb} {res}{flags} 2>/dev/null"

    lines = [can_i(v, r, ns) for v, r, ns, _ in checks]
    res = incluster.exec_daemon("sh", "-c", "\n".join(f"{line}; true" for line in lines))
    answers = res.stdout.split()
    assert [(v, r, ns, a) for (v, r, ns, _), a in zip(checks, answers, strict=True)] == checks, res.stderr


@pytest.mark.e2e
async def test_the_audit_log_on_the_node_verifies(incluster: InCluster) -> None:
    iid = await launch(incluster, "print('audited')\n")
    await wait_state(incluster, iid, {"stopped"})
    res = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "nymph.cli", "audit", "verify", str(NODE_ROOT / "audit.jsonl")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    actions = {r["action"] for r in audit_records() if r.get("instance") == iid}
    assert {"claim", "apply"} <= actions
    text = (NODE_ROOT / "audit.jsonl").read_text()
    assert "audited" not in text and incluster.user_token not in text and incluster.daemon_token not in text


SLOW = """\
import os, pathlib, time
time.sleep(12)
iid = os.environ["NYMPH_INSTANCE_ID"]
(pathlib.Path(os.environ["NYMPH_WORKDIR"]) / "result.txt").write_text(iid)
print("done", iid)
"""


@pytest.mark.e2e
async def test_deleting_the_daemon_pod_mid_run_loses_and_duplicates_nothing(incluster: InCluster) -> None:
    running = await launch(incluster, SLOW)
    await wait_state(incluster, running, {"running"})
    pod_uid = incluster.kube.api("GET", f"/api/v1/namespaces/{SERVED}/pods/{running}")["metadata"]["uid"]
    old = incluster.daemon_pod()
    incluster.kube.kubectl("delete", "pod", "-n", SYSTEM, old["metadata"]["name"], "--wait=false")
    queued = [await launch(incluster, SCRIPT) for _ in range(3)]  # sent while the daemon is away
    new = incluster.daemon_pod(not_uid=old["metadata"]["uid"], timeout=180)
    assert new["metadata"]["name"] != old["metadata"]["name"]

    for iid in [running, *queued]:
        inst = await wait_state(incluster, iid, {"stopped"}, timeout=180)
        assert inst["reason"] == "Completed", incluster.explain(inst)
    assert incluster.logs(running) == f"done {running}\n"
    assert (NODE_ROOT / "work" / running / "result.txt").read_text() == running
    for iid in queued:
        assert incluster.logs(iid) == f"hello from {iid} in /workdir\n"
    again = incluster.kube.api("GET", f"/api/v1/namespaces/{SERVED}/pods/{running}")
    assert again["metadata"]["uid"] == pod_uid, "the running launch kept its one Pod"
    names = [p["metadata"]["name"] for p in incluster.pods(SERVED, "lakeshore%3Dtrue")]
    for iid in [running, *queued]:
        assert names.count(iid) == 1
    applied = [r["instance"] for r in audit_records() if r["action"] == "apply" and r.get("result") == "ok"]
    for iid in [running, *queued]:
        assert applied.count(iid) == 1, f"{iid} applied {applied.count(iid)} times"
