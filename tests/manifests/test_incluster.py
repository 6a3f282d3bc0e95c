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
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from nymph.localcluster import LocalCluster
from nymph.localcluster.images import LocalImage
from tests.support.incluster import (
    NODE_ROOT,
    QUEUE_UID,
    REPO,
    SERVED,
    SYSTEM,
    InCluster,
    apply,
    audit_records,
    connect,
    kustomize,
    launch,
    node_root_set_aside,
    one_of,
    render,
    teardown,
    wait_namespace_gone,
    wait_state,
)

# a cold first run builds the python base and the nymph image (several minutes on 2 cores)
pytestmark = pytest.mark.timeout(900)


# --- the overlay itself (no cluster needed) ---------------------------------------------------


def test_local_overlay_keeps_the_daemon_as_shipped() -> None:
    base = kustomize(REPO / "manifests" / "base")
    local = kustomize(REPO / "manifests" / "overlays" / "local")
    for kind in ("Namespace", "ServiceAccount", "Role", "RoleBinding", "Service"):
        assert [d for d in local if d["kind"] == kind] == [d for d in base if d["kind"] == kind], kind
    b_ds, l_ds = one_of(base, "DaemonSet"), one_of(local, "DaemonSet")
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
    queue = one_of(local, "Deployment")["spec"]["template"]["spec"]
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
def test_the_nymph_image_built_here_runs(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """daemonset/Dockerfile on the local python base: nymph and kubectl run inside it."""
    _buildah_or_skip()
    image: LocalImage = request.getfixturevalue("nymph_image")
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


@pytest.fixture(scope="module")
def incluster(
    real_kube: LocalCluster, nymph_image_on_node: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[InCluster]:
    kube = real_kube
    node = kube.real_node
    assert node is not None
    queue_data = tmp_path_factory.mktemp("queue-data")
    os.chown(queue_data, QUEUE_UID, QUEUE_UID)
    docs = render(kube, queue_data)
    daemon_token = f"nyq_{secrets.token_urlsafe(32)}"
    wait_namespace_gone(kube)  # an earlier deployment in this session may still be going
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
            ic = connect(kube, daemon_token=daemon_token)
            yield ic
        finally:
            teardown(kube, docs, node)


SCRIPT = """\
import os, pathlib
iid = os.environ["NYMPH_INSTANCE_ID"]
wd = pathlib.Path(os.environ["NYMPH_WORKDIR"])
(wd / "result.txt").write_text(f"written by {iid}\\n")
print(f"hello from {iid} in {wd}")
"""


@pytest.mark.e2e
@pytest.mark.realnode
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
@pytest.mark.realnode
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
        # the one cluster-scoped grant: read Nodes (manifests/base/daemon-node-reader.yaml)
        ("get", "nodes", "", "yes"),
        ("list", "nodes", "", "yes"),
        ("patch", "nodes", "", "no"),
        ("delete", "nodes", "", "no"),
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
@pytest.mark.realnode
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
@pytest.mark.realnode
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


@pytest.mark.e2e
@pytest.mark.realnode
async def test_a_direct_launch_from_the_in_cluster_queue_runs_for_real(incluster: InCluster) -> None:
    """dispatch: direct from the queue Pod (read-only root): the kubeconfig, kept in the queue's
    secret store, is staged in the memory-backed /tmp the manifests mount, and the Pod runs."""
    ic = incluster
    python = next(i for i in ic.kube.node_image_names if "/python:" in i)
    kubeconfig = Path(ic.kube.kubeconfig).read_text()  # noqa: ASYNC240
    async with ic.client() as c:
        await c.request("PUT", "/v1/namespaces/default/secrets/admin-kc", json={"value": kubeconfig})
        await c.create_provider(
            name="straight",
            kwargs={"namespace": SERVED, "kubeconfig": {"$secret": "admin-kc"}},
            dispatch="direct",
        )
        await c.create_mode(
            name="pyd",
            provider="straight",
            # the real node, not the kwok one beside it (nothing pins a direct Pod otherwise)
            fields={"image": python, "node_selector": {"kubernetes.io/hostname": ic.node}},
        )
        iid = str(
            (await c.launch(provider="straight", mode="pyd", script="print('hello direct')"))["instanceId"]
        )
        deadline = asyncio.get_running_loop().time() + 120
        while (inst := dict(await c.get_instance(provider="straight", instance_id=iid)))[
            "state"
        ] != "stopped":
            assert asyncio.get_running_loop().time() < deadline, inst
            await asyncio.sleep(0.5)
    assert inst["reason"] == "Completed", inst
    assert ic.logs(iid).strip() == "hello direct"
