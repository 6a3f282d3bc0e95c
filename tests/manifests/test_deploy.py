"""The in-cluster deployment: kustomize renders, the API server accepts it, and the daemon's
RBAC is sufficient (a full launch with its token) and minimal (a can-i matrix, including the
kinds the dockyard Role adds and nothing more)."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from nymph.localcluster import LocalCluster
from nymph.localcluster.cluster import kubectl_path
from tests.support.harness import REPO, DaemonProc, QueueProc, launch, setup_provider, wait_state
from tests.support.kube_fixtures import token_kubeconfig

SA = "system:serviceaccount:nymph-system:nymph-daemon"
RBAC_KINDS = {"Namespace", "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}


def kustomize(overlay: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [kubectl_path(), "kustomize", str(REPO / "manifests" / overlay)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.mark.parametrize("overlay", ["base", "overlays/kind", "overlays/k3d"])
def test_kustomize_renders(overlay: str) -> None:
    docs = kustomize(overlay)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        [
            "Namespace",
            "Namespace",
            "ServiceAccount",
            "ServiceAccount",
            "Role",
            "RoleBinding",
            "Role",
            "RoleBinding",
            "ClusterRole",
            "ClusterRoleBinding",
            "DaemonSet",
            "Deployment",
            "Service",
            "PersistentVolumeClaim",
        ]
    )
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    c = ds["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in c["env"]
    assert (
        c["livenessProbe"]["httpGet"]["path"] == "/healthz"
        and c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    )
    assert ds["spec"]["template"]["spec"]["volumes"][0]["hostPath"]["path"] == "/var/lib/nymph"
    if overlay != "base":
        assert c["imagePullPolicy"] == "Never"


def test_ha_overlay_runs_three_queue_replicas_on_postgresql() -> None:
    docs = kustomize("overlays/ha")
    kinds = sorted(d["kind"] for d in docs)
    assert "PersistentVolumeClaim" not in kinds and kinds.count("PodDisruptionBudget") == 1
    queue = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "nymph-queue")
    spec = queue["spec"]
    assert spec["replicas"] == 3 and spec["strategy"]["type"] == "RollingUpdate"
    pod = spec["template"]["spec"]
    [required] = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required["topologyKey"] == "kubernetes.io/hostname"
    assert required["labelSelector"]["matchLabels"] == spec["selector"]["matchLabels"]
    c = pod["containers"][0]
    assert not any(a.startswith("--db") for a in c["args"])  # the URL is in a Secret only
    assert {
        "name": "NYMPH_DB_URL",
        "valueFrom": {"secretKeyRef": {"name": "nymph-queue-db", "key": "url"}},
    } in c["env"]
    assert "--secret-key-file=/etc/nymph/secret-key/key" in c["args"]
    assert {v["name"] for v in pod["volumes"]} == {"secret-key", "daemon-token", "tmp"}
    assert {m["name"] for m in c["volumeMounts"]} == {"secret-key", "daemon-token", "tmp"}
    pdb = next(d for d in docs if d["kind"] == "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 2 and pdb["spec"]["selector"] == spec["selector"]


@pytest.fixture(scope="module")
def deployed(kube: LocalCluster, kuberay_crds: Path) -> list[dict[str, Any]]:
    # The dockyard Role names KubeRay kinds: can-i on them needs the CRDs installed.
    docs = kustomize("overlays/kind")
    rbac = [d for d in docs if d["kind"] in RBAC_KINDS]
    workloads = [d for d in docs if d["kind"] not in RBAC_KINDS]
    kube.kubectl(
        "apply", "--server-side", "--field-manager=nymph-tests", "-f", "-", input=yaml.safe_dump_all(rbac)
    )
    res = kube.kubectl(
        "apply",
        "--server-side",
        "--dry-run=server",
        "--field-manager=nymph-tests",
        "-f",
        "-",
        input=yaml.safe_dump_all(workloads),
        check=False,
    )
    assert res.returncode == 0, res.stderr
    return docs


def test_ha_overlay_is_accepted_by_the_api_server(kube: LocalCluster, deployed: list[dict[str, Any]]) -> None:
    workloads = [d for d in kustomize("overlays/ha") if d["kind"] not in RBAC_KINDS]
    res = kube.kubectl(
        "apply",
        "--server-side",
        "--dry-run=server",
        "--field-manager=nymph-tests",
        "-f",
        "-",
        input=yaml.safe_dump_all(workloads),
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert "poddisruptionbudget.policy/nymph-queue serverside-applied (server dry run)" in res.stdout


#: kinds the test cluster does not serve (NVIDIA's DRA driver's CRD): kubectl cannot resolve
#: their group, so the API server is asked directly, with a SubjectAccessReview for the daemon
UNSERVED = frozenset({"computedomains.resource.nvidia.com"})


def _reviewed(kube: LocalCluster, verb: str, resource: str, namespace: str | None) -> bool:
    plural, _, group = resource.partition(".")
    attributes = {
        "verb": verb,
        "group": group,
        "resource": plural,
        **({"namespace": namespace} if namespace else {}),
    }
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {"user": SA, "resourceAttributes": attributes},
    }
    answer = kube.api("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
    return bool(answer["status"].get("allowed"))


def can_i(kube: LocalCluster, verb: str, resource: str, namespace: str | None) -> bool:
    if resource in UNSERVED:
        return _reviewed(kube, verb, resource, namespace)
    res_name, _, sub = resource.partition("/")
    args = ["auth", "can-i", verb, res_name, f"--as={SA}"] + ([f"--subresource={sub}"] if sub else [])
    args += ["-n", namespace] if namespace else []
    out = kube.kubectl(*args, check=False)
    return out.stdout.strip() == "yes"


DOCKYARD_RESOURCES = (
    "deployments.apps",
    "services",
    "networkpolicies.networking.k8s.io",
    "poddisruptionbudgets.policy",
    "rayjobs.ray.io",
    "rayclusters.ray.io",
    "resourceclaimtemplates.resource.k8s.io",
    "computedomains.resource.nvidia.com",
)
ALLOWED = (
    [(v, "pods", "default") for v in ("create", "get", "list", "watch", "delete", "patch")]
    + [("get", "pods/log", "default")]
    # The one cluster-scoped grant: read Nodes (node-aware claims).
    + [(v, "nodes", None) for v in ("get", "list", "watch")]
    + [(v, r, "default") for r in DOCKYARD_RESOURCES for v in ("get", "create", "patch", "delete")]
    + [("list", "rayjobs.ray.io", "default")]
)
DENIED = [
    ("get", "secrets", "default"),
    ("list", "secrets", "default"),
    ("get", "configmaps", "default"),
    ("create", "pods/exec", "default"),
    ("update", "pods", "default"),
    ("create", "pods", "kube-system"),
    ("list", "pods", "nymph-system"),
    ("get", "secrets", "nymph-system"),
    ("get", "pods/attach", "default"),
    ("create", "pods/portforward", "default"),
    ("create", "nodes", None),
    ("update", "nodes", None),
    ("patch", "nodes", None),
    ("delete", "nodes", None),
    ("patch", "nodes/status", None),
    ("get", "nodes/proxy", None),
    ("create", "namespaces", None),
    ("create", "clusterroles", None),
    ("create", "clusterrolebindings", None),
    ("delete", "persistentvolumes", None),
    # The dockyard Role: only its kinds, only get/create/patch/delete, only served namespaces.
    ("create", "jobs.batch", "default"),
    ("create", "statefulsets.apps", "default"),
    ("create", "daemonsets.apps", "default"),
    ("create", "replicasets.apps", "default"),
    ("create", "ingresses.networking.k8s.io", "default"),
    ("create", "resourcequotas", "default"),
    ("create", "limitranges", "default"),
    ("create", "serviceaccounts", "default"),
    ("create", "roles.rbac.authorization.k8s.io", "default"),
    ("list", "deployments.apps", "default"),
    ("watch", "rayjobs.ray.io", "default"),
    ("list", "services", "default"),
    ("list", "rayclusters.ray.io", "default"),
    ("update", "deployments.apps", "default"),
    ("patch", "deployments.apps/scale", "default"),
    ("patch", "services/status", "default"),
    ("create", "deployments.apps", "kube-system"),
    ("delete", "services", "kube-system"),
    ("create", "rayclusters.ray.io", "nymph-system"),
    ("create", "rayjobs.ray.io", "kube-system"),
    ("create", "resourceclaims.resource.k8s.io", "default"),
    ("create", "deviceclasses.resource.k8s.io", None),
    ("list", "resourceclaimtemplates.resource.k8s.io", "default"),
    ("list", "computedomains.resource.nvidia.com", "default"),
    ("create", "computedomains.resource.nvidia.com", "kube-system"),
]


@pytest.mark.e2e
@pytest.mark.parametrize(("verb", "resource", "namespace"), ALLOWED)
def test_daemon_is_allowed_what_it_needs(
    kube: LocalCluster, deployed: Any, verb: str, resource: str, namespace: str
) -> None:
    assert can_i(kube, verb, resource, namespace)


@pytest.mark.e2e
@pytest.mark.parametrize(("verb", "resource", "namespace"), DENIED)
def test_daemon_is_denied_everything_else(
    kube: LocalCluster, deployed: Any, verb: str, resource: str, namespace: str | None
) -> None:
    assert not can_i(kube, verb, resource, namespace)


@pytest.mark.e2e
async def test_daemon_runs_a_full_launch_with_the_deployed_service_account(
    kube: LocalCluster, deployed: Any, tmp_path: Path
) -> None:
    kc = await asyncio.to_thread(
        token_kubeconfig, kube, namespace="nymph-system", name="nymph-daemon", path=tmp_path / "sa.kubeconfig"
    )
    who = kube.kubectl(
        "--kubeconfig", str(kc), "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}", check=False
    )
    q = QueueProc(tmp_path / "q.db")
    q.tokens()
    q.start()
    d = DaemonProc(q, kc, "default", tmp_path / "root")
    try:
        await setup_provider(q, "default")
        d.start()
        iid = await launch(q, tags={"sim.nymph.io/run": "1s"})
        inst = await wait_state(q, iid, {"stopped"})
        assert inst["reason"] == "Completed"
    finally:
        d.kill()
        q.kill()
    assert (
        SA in who.stdout or who.returncode != 0
    )  # whoami needs a newer server API; when present, it is the SA
