"""The live dockyard commands against the real local API server (etcd, RBAC, controller-manager,
kwok-simulated Pods) with the KubeRay CRDs installed. No KubeRay operator runs, so where a test
needs operator behaviour it writes the status the operator would write."""

from __future__ import annotations

import asyncio
import copy
import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from nymph.cli import main
from nymph.dockyard.errors import DockyardLiveError
from nymph.dockyard.live.endpoint import HeadTarget, dashboard
from nymph.dockyard.live.kubectl import Kube
from nymph.dockyard.render.manifests import render_manifests
from nymph.dockyard.render.task import DOCKYARD_ROLE_RULES, dockyard_task_manifests
from nymph.dockyard.spec.enums import PortForwardMode
from nymph.dockyard.spec.parse import parse_infra
from nymph.errors import NymphError
from nymph.localcluster import LocalCluster
from nymph.localcluster.apierror import ApiAnswerError
from nymph.localcluster.cluster import kubectl_path
from tests.support.kube_fixtures import SaKubeconfig, kuberay_crd_dir
from tests.support.live_helpers import live_infra

pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "examples"
RAY = "/apis/ray.io/v1/namespaces"

INFRA: dict[str, Any] = live_infra(
    launch={"mode": "rayjob", "entrypoint": "python -c \"print('dockyard-ok')\""}, sandbox_replicas=2
)

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def pair(tmp_path: Path, cli_env: None) -> tuple[Path, Path]:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("grpo: {max_num_steps: 1}\n")
    infra = tmp_path / "run.infra.yaml"
    infra.write_text(yaml.safe_dump(INFRA))
    return recipe, infra


@pytest.fixture
def dockyard(kube: LocalCluster, kuberay_crds: Path, capsys: pytest.CaptureFixture[str]) -> Run:
    """``dockyard("run", ...)`` -> (exit code, stdout, stderr) against the test cluster."""

    def run(*argv: str) -> tuple[int, str, str]:
        live = argv[0] not in ("render", "check")
        code = main(["dockyard", *argv, *(["--kubeconfig", str(kube.kubeconfig)] if live else [])])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def recipe_args(pair: tuple[Path, Path], namespace: str, *overrides: str) -> list[str]:
    return [str(pair[0]), "--infra", str(pair[1]), f"infra.namespace={namespace}", *overrides]


def exists(kube: LocalCluster, path: str) -> bool:
    try:
        kube.api("GET", path)
    except ApiAnswerError as exc:
        if exc.status == 404:
            return False
        raise
    return True


def pool_paths(namespace: str) -> dict[str, str]:
    return {
        "Deployment/sbx": f"/apis/apps/v1/namespaces/{namespace}/deployments/sbx",
        "Service/sbx": f"/api/v1/namespaces/{namespace}/services/sbx",
        "NetworkPolicy/sbx-netpol": f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies/sbx-netpol",
        "PodDisruptionBudget/sbx-pdb": f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/sbx-pdb",
    }


def wait_for(check: Callable[[], bool], *, timeout: float = 20, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def server_dry_run(kube: LocalCluster, namespace: str, manifests: list[Any]) -> list[str]:
    """``kubectl apply --server-side --dry-run=server``; the Kind/name of every accepted object."""
    stream = yaml.safe_dump_all(manifests, sort_keys=False)
    proc = kube.kubectl(
        "apply", "--server-side", "--dry-run=server", "--field-manager=nymph", "-n", namespace, "-o", "json",
        "-f", "-", input=stream, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    items = doc["items"] if doc.get("kind") == "List" else [doc]
    return [f"{i['kind']}/{i['metadata']['name']}" for i in items]


# -- doctor without the KubeRay CRDs (first: see the fixture) ---------------------------------


def _install_crds(kube: LocalCluster) -> None:
    directory = kuberay_crd_dir()
    assert directory is not None
    for name in ("ray.io_rayclusters.yaml", "ray.io_rayjobs.yaml"):
        kube.kubectl("apply", "--server-side", "--field-manager=nymph-tests", "-f", str(directory / name))

    def established() -> bool:
        for crd in ("rayclusters.ray.io", "rayjobs.ray.io"):
            obj = kube.api("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}")
            conditions = (obj.get("status") or {}).get("conditions") or []
            if not any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
                return False
        return True

    wait_for(established, timeout=60, what="the KubeRay CRDs to be established")


@pytest.fixture
def without_kuberay_crds(kube: LocalCluster) -> Iterator[None]:
    """The CRDs absent for one test, installed after it. This is the first test of the module
    so that in a whole run nothing has installed them yet; otherwise they are deleted (which
    waits until every RayJob / RayCluster in the cluster is gone)."""
    if exists(kube, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/rayjobs.ray.io"):
        kube.kubectl(
            "delete", "crd", "rayclusters.ray.io", "rayjobs.ray.io", "--ignore-not-found", "--timeout=60s"
        )
    try:
        yield
    finally:
        _install_crds(kube)


def test_doctor_reports_missing_kuberay_crds(
    kube: LocalCluster, without_kuberay_crds: None, capsys: pytest.CaptureFixture[str], cli_env: None
) -> None:
    code = main(["dockyard", "doctor", "--kubeconfig", str(kube.kubeconfig), "-n", "default"])
    out = capsys.readouterr().out
    assert code == 1
    assert "FAIL  KubeRay CRDs missing: rayclusters.ray.io, rayjobs.ray.io" in out
    assert "install the KubeRay operator" in out


# -- every rendered manifest passes a server-side dry run ---------------------------------------


@pytest.mark.parametrize("name", ["vllm", "sglang"])
def test_example_pairs_pass_server_dry_run(
    name: str, dockyard: Run, kube: LocalCluster, namespace: str
) -> None:
    args = [
        str(EXAMPLES / f"dockyard-grpo-{name}.yaml"),
        "--infra",
        str(EXAMPLES / f"dockyard-grpo-{name}.infra.yaml"),
        f"infra.namespace={namespace}",
    ]
    code, rendered, err = dockyard("render", *args)
    assert (code, err) == (0, "")
    manifests = list(yaml.safe_load_all(rendered))
    expected = [f"{m['kind']}/{m['metadata']['name']}" for m in manifests]
    assert server_dry_run(kube, namespace, manifests) == expected

    # The same through `run --dry-run`: every applied kind accepted, render-only kinds skipped.
    code, out, err = dockyard("run", *args, "--dry-run")
    assert (code, err) == (0, "")
    for ref in expected:
        if ref.split("/")[0] in ("ResourceQuota", "LimitRange"):
            assert f"skipped {ref}: render-only" in out
        else:
            assert f"{ref}: accepted (server dry run)" in out
    assert "nothing changed" in out
    assert kube.api("GET", f"/apis/apps/v1/namespaces/{namespace}/deployments")["items"] == []
    assert kube.api("GET", f"{RAY}/{namespace}/rayjobs")["items"] == []
    assert kube.api("GET", f"{RAY}/{namespace}/rayclusters")["items"] == []


VARIANTS: dict[str, dict[str, Any]] = {
    "rayjob": {},
    "bringup-gpu-pdb-hardened": {
        "launch": {"mode": "bringup", "env": {"A": "1"}},
        "kuberay": {"pdb": {"enabled": True, "minAvailable": 2}, "segmentSize": 1},
        "security": {
            "enabled": True,
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "readOnlyRootFilesystem": True,
        },
    },
    "attach-locked-sandbox": {
        "launch": {"mode": "attach", "attach": "existing"},
        "sandbox": {
            "networkPolicy": {
                "allowEgress": False,
                "allowedEgressCidrs": ["10.0.0.0/8"],
                "fromLabels": {"a": "b"},
            },
            "security": {"runAsNonRoot": True, "runAsUser": 1000},
            "pdb": {"minAvailable": "50%"},
            "topologySpreadConstraints": [
                {
                    "maxSkew": 1,
                    "topologyKey": "kubernetes.io/hostname",
                    "whenUnsatisfiable": "ScheduleAnyway",
                    "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "sbx"}},
                }
            ],
        },
    },
    "placement-storage-scheduler-governance": {
        "scheduler": {"kind": "kai", "queue": "rl"},
        "priorityClassName": "p",
        "serviceAccount": "sa",
        "imagePullSecrets": ["a"],
        "placement": {
            "nodeSelector": {"gpu": "yes"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "affinity": {"podAntiAffinity": {}},
        },
        "networking": {"hostNetwork": True, "nccl_net": "IB", "extra_env": {"X": "1"}},
        "workspace": {"kind": "hostPath", "hostPath": "/data"},
        "hf_cache": {"kind": "emptyDir"},
        "checkpoints": {"kind": "pvc", "pvcName": "ckpt"},
        "labels": {"team": "a"},
        "annotations": {"note": "x"},
        "resourceQuota": {"enabled": True, "hard": {"pods": 10, "requests.nvidia.com/gpu": 16}},
        "limitRange": {"enabled": True, "default": {"cpu": 1}, "defaultRequest": {"cpu": "500m"}},
    },
    "inline-sandbox-spec-open": {
        "sandbox": {
            "security": {"enabled": False},
            "networkPolicy": {"enabled": False},
            "pdb": {"enabled": False},
            "spec": {
                "template": {"spec": {"containers": [{"name": "exec", "ports": [{"containerPort": 9090}]}]}},
            },
        }
    },
}


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value
    return base


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_render_variants_pass_server_dry_run(
    variant: str, kube: LocalCluster, kuberay_crds: Path, namespace: str
) -> None:
    infra = _merge({**copy.deepcopy(INFRA), "namespace": namespace}, copy.deepcopy(VARIANTS[variant]))
    manifests = render_manifests(infra=parse_infra(infra))
    expected = [f"{m['kind']}/{m['metadata']['name']}" for m in manifests]
    assert server_dry_run(kube, namespace, list(manifests)) == expected


# -- cluster up / list / down ------------------------------------------------------------------


def test_cluster_up_list_down(
    dockyard: Run, kube: LocalCluster, namespace: str, pair: tuple[Path, Path]
) -> None:
    args = recipe_args(
        pair, namespace, "infra.resourceQuota.enabled=true", "infra.resourceQuota.hard={pods: 5}"
    )
    code, out, err = dockyard("cluster", "up", *args, "--dry-run")
    assert (code, err) == (0, "")
    assert "RayCluster/grpo: accepted (server dry run)" in out
    assert not exists(kube, f"{RAY}/{namespace}/rayclusters/grpo")

    code, out, err = dockyard("cluster", "up", *args, "--no-wait")
    assert (code, err) == (0, "")
    assert "skipped ResourceQuota/dockyard-quota: render-only" in out
    for ref in [*pool_paths(namespace), "RayCluster/grpo"]:
        assert f"{ref}: applied" in out
    assert exists(kube, f"{RAY}/{namespace}/rayclusters/grpo")
    assert not exists(kube, f"/api/v1/namespaces/{namespace}/resourcequotas/dockyard-quota")
    netpol = kube.api("GET", pool_paths(namespace)["NetworkPolicy/sbx-netpol"])
    assert netpol["spec"]["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "sbx"}}

    # The controller-manager really creates the pool's Pods; kwok runs them.
    def running() -> int:
        pods = kube.api(
            "GET", f"/api/v1/namespaces/{namespace}/pods?labelSelector=app.kubernetes.io/name%3Dsbx"
        )
        return sum(1 for p in pods["items"] if p["status"].get("phase") == "Running")

    wait_for(lambda: running() == 2, what="2 running sandbox pods")

    code, out, err = dockyard("cluster", "list", "-n", namespace)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "NAMESPACE", "STATE", "WORKERS", "GPUS", "OWNER", "AGE"]
    assert lines[1].split()[:3] == ["grpo", namespace, "pending"]
    pool_header = lines.index(next(ln for ln in lines if ln.startswith("SANDBOX POOL")))
    assert lines[pool_header + 1].split()[:2] == ["sbx", namespace]

    code, out, err = dockyard("cluster", "list", "-A")
    assert code == 0 and any(ln.split()[:2] == ["grpo", namespace] for ln in out.splitlines())

    code, out, err = dockyard("cluster", "down", *args)
    assert (code, err) == (0, "")
    assert "raycluster.ray.io/grpo: deleted" in out
    assert "deployment.apps/sbx: deleted" in out
    assert "deleted 6 objects" not in out  # there was no RayJob: 5 objects
    assert "deleted 5 objects" in out
    assert not exists(kube, f"{RAY}/{namespace}/rayclusters/grpo")
    for path in pool_paths(namespace).values():
        assert not exists(kube, path)

    code, out, err = dockyard("cluster", "list", "-n", namespace)
    assert (code, err) == (0, "")
    assert f"no RayClusters in namespace {namespace}" in out
    assert f"no dockyard sandbox pools in namespace {namespace}" in out

    code, out, _ = dockyard("cluster", "down", *args)
    assert code == 0 and "nothing to delete" in out


# -- run (rayjob mode) ---------------------------------------------------------------------------


def test_run_no_wait_creates_the_rayjob_and_the_sandbox(
    dockyard: Run, kube: LocalCluster, namespace: str, pair: tuple[Path, Path]
) -> None:
    code, out, err = dockyard("run", *recipe_args(pair, namespace), "--no-wait")
    assert (code, err) == (0, "")
    assert out.index("PodDisruptionBudget/sbx-pdb: applied") < out.index("RayJob/grpo: applied")
    job = kube.api("GET", f"{RAY}/{namespace}/rayjobs/grpo")
    assert job["spec"]["entrypoint"] == "python -c \"print('dockyard-ok')\""
    assert job["metadata"]["managedFields"][0]["manager"] == "nymph"
    for path in pool_paths(namespace).values():
        assert exists(kube, path)

    code, out, err = dockyard("status", *recipe_args(pair, namespace))
    assert (code, err) == (0, "")
    assert "RayJob/grpo" in out and "deployment=New job=-" in out
    assert "Service/sbx" in out and "port 9090" in out

    # Head logs need the cluster KubeRay has not created yet: a clear one-line error.
    code, out, err = dockyard("logs", *recipe_args(pair, namespace), "--source", "head")
    assert code == 2
    assert err.strip().splitlines()[-1] == (
        "nymph: error: RayJob grpo has no RayCluster yet (deployment=New job=-); retry in a moment"
    )


def _drive_rayjob(kube: LocalCluster, namespace: str, steps: list[dict[str, Any]]) -> threading.Thread:
    """Write the RayJob statuses the operator would, one step a second (slow enough for a
    follower polling every 0.1 s to see each, on a loaded machine too)."""

    def drive() -> None:
        path = f"{RAY}/{namespace}/rayjobs/grpo"
        wait_for(lambda: exists(kube, path), what="the RayJob")
        for step in steps:
            time.sleep(1.0)
            kube.api("PATCH", f"{path}/status", {"status": step}, content_type="application/merge-patch+json")

    thread = threading.Thread(target=drive, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize(
    ("final", "code"),
    [({"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}, 0), ({"jobDeploymentStatus": "Failed", "jobStatus": "FAILED", "message": "driver exited 1"}, 1)],
)  # fmt: skip
def test_run_follows_the_rayjob_to_a_terminal_state(
    final: dict[str, Any],
    code: int,
    dockyard: Run,
    kube: LocalCluster,
    namespace: str,
    pair: tuple[Path, Path],
) -> None:
    steps = [
        {"jobDeploymentStatus": "Initializing"},
        {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "rayClusterName": "grpo-x7k2p"},
        final,
    ]
    thread = _drive_rayjob(kube, namespace, steps)
    got, out, err = dockyard("run", *recipe_args(pair, namespace), "--poll", "0.1", "--timeout", "60")
    thread.join(5)
    assert (got, err) == (code, "")
    assert "sandbox pool sbx: 2/2 ready" in out  # waited for the pool before the RayJob
    assert out.index("sandbox pool sbx: 2/2 ready") < out.index("RayJob/grpo: applied")
    changes = [ln.split("] ", 1)[1] for ln in out.splitlines() if "] RayJob grpo: " in ln]
    assert changes == [
        "RayJob grpo: deployment=New job=-",
        "RayJob grpo: deployment=Initializing job=-",
        "RayJob grpo: deployment=Running job=RUNNING cluster=grpo-x7k2p",
        "RayJob grpo: " + ("deployment=Complete job=SUCCEEDED cluster=grpo-x7k2p" if code == 0 else
                           "deployment=Failed job=FAILED cluster=grpo-x7k2p (driver exited 1)"),
    ]  # fmt: skip
    assert out.rstrip().endswith("RayJob grpo succeeded" if code == 0 else "(driver exited 1)")

    # A finished RayJob is not silently re-applied.
    again, _, err = dockyard("run", *recipe_args(pair, namespace), "--no-wait")
    assert again == 2 and "RayJob grpo already ran to the end" in err


def test_run_into_a_missing_namespace_is_one_line(dockyard: Run, pair: tuple[Path, Path]) -> None:
    code, _, err = dockyard("run", *recipe_args(pair, "no-such-ns"), "--no-wait")
    assert code == 2
    line = err.strip()
    assert line.startswith("nymph: error: ") and "\n" not in line
    assert "no-such-ns" in line and "kubectl create namespace no-such-ns" in line


# -- logs and the head through port-forward -------------------------------------------------------


def test_logs_select_the_pool_pods(
    dockyard: Run, kube: LocalCluster, namespace: str, pair: tuple[Path, Path]
) -> None:
    assert dockyard("cluster", "up", *recipe_args(pair, namespace), "--no-wait")[0] == 0
    code, _, err = dockyard("logs", *recipe_args(pair, namespace), "--source", "worker")
    assert code == 2 and "no pods for the worker of RayCluster grpo" in err
    # kwok's simulated Pods have no kubelet to serve logs: the pods are found, and kubectl's
    # refusal comes back as one line.
    wait_for(
        lambda: len(kube.api("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]) >= 2,
        what="sandbox pods",
    )
    code, _, err = dockyard("logs", *recipe_args(pair, namespace), "--source", "sandbox", "--tail", "5")
    lines = err.strip().splitlines()
    assert lines[0].startswith("logs of ") and lines[0].endswith("pod(s) of the sandbox pool sbx")
    assert code == 2 and lines[-1].startswith("nymph: error: logs of the sandbox pool sbx: ")


def test_job_list_port_forwards_to_the_head_service(
    dockyard: Run, kube: LocalCluster, namespace: str, pair: tuple[Path, Path]
) -> None:
    """Without --ray-address: find the head Service, wait for a ready head Pod, then
    kubectl port-forward to its dashboard port (kwok has no kubelet, so the forward itself
    is refused, and that is reported as one line)."""
    assert dockyard("cluster", "up", *recipe_args(pair, namespace), "--no-wait")[0] == 0
    code, _, err = dockyard("job", "list", "--cluster", "grpo", "-n", namespace, "--timeout", "0.5")
    assert code == 2 and "no head service grpo-head-svc for RayCluster grpo in time" in err

    labels = {"ray.io/cluster": "grpo", "ray.io/node-type": "head", "sim.nymph.io/run": "1h"}
    kube.api(
        "POST",
        f"/api/v1/namespaces/{namespace}/pods",
        {"metadata": {"name": "grpo-head", "labels": labels}, "spec": {"containers": [{"name": "ray-head", "image": "x"}]}},
    )  # fmt: skip
    kube.api(
        "POST",
        f"/api/v1/namespaces/{namespace}/services",
        {
            "metadata": {"name": "grpo-head-svc"},
            "spec": {
                "selector": {"ray.io/cluster": "grpo", "ray.io/node-type": "head"},
                "ports": [{"name": "dashboard", "port": 8265}],
            },
        },
    )
    code, _, err = dockyard("job", "list", "--cluster", "grpo", "-n", namespace, "--poll", "0.2")
    assert code == 2
    assert (
        err.strip()
        .splitlines()[-1]
        .startswith(f"nymph: error: kubectl port-forward to service/grpo-head-svc in {namespace} failed: ")
    )


def test_submit_kind_rayjob_hands_the_run_to_kuberay(
    dockyard: Run, kube: LocalCluster, namespace: str, pair: tuple[Path, Path]
) -> None:
    args = recipe_args(pair, namespace, "infra.launch.mode=bringup", "infra.submit.kind=rayjob")
    # The working dir cannot travel in a RayJob: refused before anything is applied.
    code, _, err = dockyard("run", *args, "--no-wait")
    assert code == 2 and "submit.kind: rayjob cannot upload the working dir" in err
    assert not exists(kube, f"/apis/ray.io/v1/namespaces/{namespace}/rayclusters/grpo")

    image = ["--code-source", "image", "--code-path", "/opt/code", "--run-id", "Run.One", "--no-wait"]
    code, out, err = dockyard("run", *args, *image)
    assert (code, err) == (0, "")
    assert "submitted RayJob run-one to RayCluster grpo (submit.kind: rayjob)" in out
    job = kube.api("GET", f"/apis/ray.io/v1/namespaces/{namespace}/rayjobs/run-one")
    assert job["spec"]["clusterSelector"] == {"ray.io/cluster": "grpo"}
    assert job["spec"]["entrypoint"] == "cd /opt/code && python -c \"print('dockyard-ok')\""
    assert yaml.safe_load(job["spec"]["runtimeEnvYAML"])["env_vars"]["DOCKYARD_K8S_RUN_ID"] == "Run.One"
    assert "rayClusterSpec" not in job["spec"]
    assert exists(kube, f"/apis/ray.io/v1/namespaces/{namespace}/rayclusters/grpo")

    code, _, err = dockyard("run", *args, *image)
    assert code == 2 and f"RayJob run-one exists already in {namespace}: pass another --run-id" in err


def _fake_head(kube: LocalCluster, namespace: str) -> None:
    labels = {"ray.io/cluster": "grpo", "ray.io/node-type": "head", "sim.nymph.io/run": "1h"}
    kube.api(
        "POST",
        f"/api/v1/namespaces/{namespace}/pods",
        {"metadata": {"name": "grpo-head", "labels": labels}, "spec": {"containers": [{"name": "ray-head", "image": "x"}]}},
    )  # fmt: skip
    kube.api(
        "POST",
        f"/api/v1/namespaces/{namespace}/services",
        {
            "metadata": {"name": "grpo-head-svc"},
            "spec": {
                "selector": {"ray.io/cluster": "grpo", "ray.io/node-type": "head"},
                "ports": [{"name": "dashboard", "port": 8265}],
            },
        },
    )


@pytest.mark.parametrize("mode", list(PortForwardMode))
def test_submit_port_forward_inside_the_cluster(
    mode: PortForwardMode,
    dockyard: Run,
    kube: LocalCluster,
    namespace: str,
    pair: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As if in a Pod (no kubeconfig named): ``auto`` uses the head Service's address, the
    explicit modes forward anyway; kwok has no kubelet, so that forward is refused, and said
    in one error."""
    assert dockyard("cluster", "up", *recipe_args(pair, namespace), "--no-wait")[0] == 0
    _fake_head(kube, namespace)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.delenv("KUBECONFIG", raising=False)
    client = Kube.connect(kubeconfig=str(kube.kubeconfig), context=None)
    said: list[str] = []

    async def reach() -> str:
        target = HeadTarget(namespace=namespace, cluster="grpo", deadline=time.monotonic() + 60, interval=0.2)
        async with dashboard(
            client, target, ray_address=None, kubeconfig=None, say=said.append, forward=mode
        ) as url:
            return url

    if mode is PortForwardMode.AUTO:
        assert asyncio.run(reach()) == f"http://grpo-head-svc.{namespace}.svc.cluster.local:8265"
        assert not any("port-forward" in line for line in said)
    else:
        with pytest.raises(
            DockyardLiveError, match=f"kubectl port-forward to service/grpo-head-svc in {namespace} failed: "
        ):
            asyncio.run(reach())


# -- doctor --------------------------------------------------------------------------------------


def test_doctor_with_a_recipe(
    dockyard: Run, kube: LocalCluster, namespace: str, pair: tuple[Path, Path]
) -> None:
    args = recipe_args(pair, namespace, "infra.priorityClassName=dockyard-doctor-test")
    code, out, err = dockyard("doctor", *args)
    assert (code, err) == (1, "")
    lines = out.splitlines()
    assert lines[0].startswith("ok    kubectl reaches the API server (Kubernetes v")
    assert f"ok    namespace {namespace} exists" in lines
    assert any(ln.startswith(f"ok    authorised in namespace {namespace}") for ln in lines)
    assert "ok    KubeRay CRDs installed: rayclusters.ray.io, rayjobs.ray.io (ray.io/v1)" in lines
    assert (
        "FAIL  PriorityClass dockyard-doctor-test not found (create it, or change infra.priorityClassName)"
        in lines
    )
    assert any(ln.startswith("note  NetworkPolicy objects are accepted") for ln in lines)
    assert lines[-1] == "1 check(s) failed"

    kube.api(
        "POST",
        "/apis/scheduling.k8s.io/v1/priorityclasses",
        {"metadata": {"name": "dockyard-doctor-test"}, "value": 1000},
    )
    try:
        code, out, _ = dockyard("doctor", *args)
        assert code == 0 and "ok    PriorityClass dockyard-doctor-test exists" in out
        assert out.splitlines()[-1] == "all checks passed"
    finally:
        kube.api("DELETE", "/apis/scheduling.k8s.io/v1/priorityclasses/dockyard-doctor-test")


def test_doctor_names_what_a_restricted_account_may_not_do(
    kube: LocalCluster,
    kuberay_crds: Path,
    namespace: str,
    sa_kubeconfig: SaKubeconfig,
    capsys: pytest.CaptureFixture[str],
    cli_env: None,
) -> None:
    restricted = sa_kubeconfig(namespace=namespace, rules=DOCKYARD_ROLE_RULES, name="daemonlike")
    code = main(["dockyard", "doctor", "--kubeconfig", str(restricted), "-n", namespace])
    out = capsys.readouterr().out
    assert code == 1
    assert f"warn  namespace {namespace}: cannot check (forbidden)" in out
    denied = next(ln for ln in out.splitlines() if ln.startswith("FAIL  not authorised"))
    assert denied.endswith(
        "to: list rayclusters.ray.io, list pods, get pods/log, create pods/portforward "
        "(ask an administrator for a Role with these verbs)"
    )
    assert "ok    KubeRay CRDs installed" in out  # discovery needs no grant


def test_doctor_names_what_dev_and_exec_may_not_do(
    kube: LocalCluster,
    kuberay_crds: Path,
    namespace: str,
    sa_kubeconfig: SaKubeconfig,
    capsys: pytest.CaptureFixture[str],
    cli_env: None,
) -> None:
    # Everything `run` / `job` need, and the dev Pod itself, but no exec and no Secrets.
    rules = [
        *DOCKYARD_ROLE_RULES,
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "create", "patch", "delete"]},
        {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["pods/portforward"], "verbs": ["create"]},
        {"apiGroups": ["ray.io"], "resources": ["rayclusters"], "verbs": ["list"]},
    ]
    restricted = sa_kubeconfig(namespace=namespace, rules=rules, name="noexec")
    code = main(["dockyard", "doctor", "--kubeconfig", str(restricted), "-n", namespace])
    out = capsys.readouterr().out
    assert code == 1
    lines = out.splitlines()
    assert any(
        ln.startswith(f"ok    authorised in namespace {namespace} for everything the live") for ln in lines
    ), out
    assert (
        f"FAIL  not authorised in namespace {namespace} for dev and the exec submitter to: "
        "create pods/exec, get secrets, create secrets, patch secrets "
        "(ask an administrator for a Role with these verbs)"
    ) in lines

    # Granting them clears the line.
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles/noexec"
    role = kube.api("GET", rbac)
    role["rules"] += [
        {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create", "patch"]},
    ]
    kube.api("PUT", rbac, role)
    main(["dockyard", "doctor", "--kubeconfig", str(restricted), "-n", namespace])
    out = capsys.readouterr().out
    assert (
        f"ok    authorised in namespace {namespace} for everything dev and the exec submitter do (8 checks)"
        in out
    )
    assert "not authorised" not in out


# -- the daemon's Role is enough to apply and delete a dockyard task ----------------------------------


def test_role_rules_suffice_for_a_dispatched_task(
    kube: LocalCluster, kuberay_crds: Path, namespace: str, sa_kubeconfig: SaKubeconfig
) -> None:
    infra = copy.deepcopy(INFRA)
    infra["kuberay"]["pdb"] = {"enabled": True, "maxUnavailable": 0}
    infra["resourceQuota"] = {"enabled": True, "hard": {"pods": 5}}
    restricted = sa_kubeconfig(namespace=namespace, rules=DOCKYARD_ROLE_RULES, name="dispatcher")

    def as_daemon(*args: str, stdin: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [kubectl_path(), f"--kubeconfig={restricted}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    for mode in ("rayjob", "bringup"):
        manifests = dockyard_task_manifests(
            recipe={"grpo": {}}, infra=infra, overrides=[f"infra.launch.mode={mode}"], namespace=namespace
        )
        assert "ResourceQuota" not in [m["kind"] for m in manifests]
        stream = yaml.safe_dump_all(manifests, sort_keys=False)
        applied = as_daemon("apply", "--server-side", "--field-manager=nymph", "-f", "-", stdin=stream)
        assert applied.returncode == 0, applied.stderr
        again = as_daemon("apply", "--server-side", "--field-manager=nymph", "-f", "-", stdin=stream)
        assert again.returncode == 0, again.stderr
        deleted = as_daemon("delete", "-f", "-", "--wait=false", stdin=stream)
        assert deleted.returncode == 0, deleted.stderr

    quota = yaml.safe_dump(
        {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "q", "namespace": namespace}}
    )
    refused = as_daemon("apply", "--server-side", "--field-manager=nymph", "-f", "-", stdin=quota)
    assert refused.returncode != 0 and "forbidden" in refused.stderr


def test_cluster_up_waits_for_the_pool_and_the_cluster(
    dockyard: Run, kube: LocalCluster, namespace: str, pair: tuple[Path, Path]
) -> None:
    def operator() -> None:  # what KubeRay would report once the head and workers run
        path = f"{RAY}/{namespace}/rayclusters/grpo"
        wait_for(lambda: exists(kube, path), what="the RayCluster")
        # ready only a while after the pool is (the command follows the pool first, then
        # reports the cluster pending, then ready; slow enough for a loaded machine)
        pool = f"/apis/apps/v1/namespaces/{namespace}/deployments/sbx"
        wait_for(
            lambda: (kube.api("GET", pool).get("status") or {}).get("readyReplicas") == 2,
            timeout=60,
            what="the pool",
        )
        time.sleep(2.0)
        status = {"state": "ready", "desiredWorkerReplicas": 2, "availableWorkerReplicas": 2}
        kube.api("PATCH", f"{path}/status", {"status": status}, content_type="application/merge-patch+json")

    thread = threading.Thread(target=operator, daemon=True)
    thread.start()
    code, out, err = dockyard(
        "cluster", "up", *recipe_args(pair, namespace), "--poll", "0.1", "--timeout", "60"
    )
    thread.join(10)
    assert (code, err) == (0, "")
    lines = [ln.split("] ", 1)[-1] for ln in out.splitlines()]
    assert lines.index("sandbox pool sbx: 2/2 ready") < lines.index(
        "RayCluster grpo: state=ready workers=2/2"
    )
    assert "RayCluster grpo: state=pending" in lines
    assert lines[-1] == f"RayCluster grpo is ready in {namespace}"

    code, out, _ = dockyard("status", *recipe_args(pair, namespace, "infra.launch.mode=bringup"))
    assert code == 0 and "state=ready workers=2/2" in out
    assert dockyard("cluster", "down", *recipe_args(pair, namespace))[0] == 0
    code, out, _ = dockyard("status", *recipe_args(pair, namespace, "infra.launch.mode=bringup"))
    assert code == 1
    assert [ln.split() for ln in out.splitlines()[1:]] == [
        [ref, "absent"] for ref in [*pool_paths(namespace), "RayCluster/grpo"]
    ]


def test_a_rendered_resource_quota_applied_by_hand_refuses_a_pod_over_it(
    dockyard: Run, kube: LocalCluster, namespace: str, pair: tuple[Path, Path]
) -> None:
    """``render`` of an infra with ``resourceQuota`` gives a ResourceQuota the API server
    enforces once an administrator applies it: with ``pods: 1`` a second Pod is refused."""
    code, out, err = dockyard(
        "render",
        *recipe_args(
            pair, namespace, "infra.resourceQuota.enabled=true", "infra.resourceQuota.hard={pods: 1}"
        ),
    )
    assert (code, err) == (0, "")
    quota = next(d for d in yaml.safe_load_all(out) if d and d["kind"] == "ResourceQuota")
    kube.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(quota))
    path = f"/api/v1/namespaces/{namespace}/resourcequotas/{quota['metadata']['name']}"
    wait_for(lambda: "hard" in (kube.api("GET", path).get("status") or {}), what="the quota's status")

    def pod(name: str) -> dict[str, Any]:
        return {"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "x"}]}}

    kube.api("POST", f"/api/v1/namespaces/{namespace}/pods", pod("first"))
    with pytest.raises(NymphError, match=r"HTTP 403.*exceeded quota"):
        kube.api("POST", f"/api/v1/namespaces/{namespace}/pods", pod("second"))
