"""The dockyard-k8s commands and flags nymph adds: ``run`` flags, ``job`` by recipe, ``render
--dry-run``, ``status`` pod phases, ``dev`` and ``cluster dashboard``, against the real local API
server (kwok keeps the Pods) and, for Ray jobs, the real local Ray head."""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from nymph.cli import main
from nymph.dockyard.live import handles
from nymph.dockyard.live.rayapi import RayJobsClient
from nymph.localcluster import LocalCluster
from tests.support.live_helpers import live_infra

pytestmark = pytest.mark.e2e
RAY = "/apis/ray.io/v1/namespaces"
OK = "python -c \"print('dockyard-ok')\""
Cli = Callable[..., tuple[int, str, str]]


@pytest.fixture
def cli(
    capsys: pytest.CaptureFixture[str], cli_env: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Cli:
    monkeypatch.setenv(handles.RUNS_ENV, str(tmp_path / "runs"))

    def run(*argv: str) -> tuple[int, str, str]:
        code = main(["dockyard", *argv])
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture
def pair(tmp_path: Path) -> Callable[..., tuple[Path, Path]]:
    def make(launch: dict[str, Any], *, name: str = "run") -> tuple[Path, Path]:
        recipe = tmp_path / f"{name}.yaml"
        recipe.write_text("grpo: {max_num_steps: 1}\n")
        infra = tmp_path / f"{name}.infra.yaml"
        infra.write_text(yaml.safe_dump(live_infra(launch=launch, sandbox_replicas=1)))
        return recipe, infra

    return make


def kube_args(kube: LocalCluster) -> list[str]:
    return ["--kubeconfig", str(kube.kubeconfig)]


def head_service(kube: LocalCluster, namespace: str, cluster: str = "grpo") -> None:
    """What the KubeRay operator creates for a cluster: its head Service."""
    kube.api(
        "POST",
        f"/api/v1/namespaces/{namespace}/services",
        {
            "metadata": {"name": f"{cluster}-head-svc"},
            "spec": {
                "selector": {"ray.io/cluster": cluster, "ray.io/node-type": "head"},
                "ports": [{"name": "dashboard", "port": 8265}],
            },
        },
    )


def ray_pod(kube: LocalCluster, namespace: str, name: str, node_type: str, group: str = "") -> None:
    """A Pod as KubeRay labels them (kwok keeps it Running)."""
    labels = {"ray.io/cluster": "grpo", "ray.io/node-type": node_type, "sim.nymph.io/run": "1h"}
    if group:
        labels["ray.io/group"] = group
    kube.api(
        "POST",
        f"/api/v1/namespaces/{namespace}/pods",
        {"metadata": {"name": name, "labels": labels}, "spec": {"containers": [{"name": "c", "image": "x"}]}},
    )


def wait_running(kube: LocalCluster, namespace: str, name: str) -> None:
    for _ in range(200):
        pod = kube.api("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        if pod.get("status", {}).get("phase") == "Running":
            return
        asyncio.run(asyncio.sleep(0.1))
    raise AssertionError(f"pod {name} not Running")


# -- render --dry-run ---------------------------------------------------------------------------


def test_render_dry_run_sends_everything_rendered_to_the_server(
    cli: Cli, kube: LocalCluster, kuberay_crds: Path, namespace: str, pair: Callable[..., tuple[Path, Path]]
) -> None:
    recipe, infra = pair({"mode": "rayjob", "entrypoint": OK})
    args = [str(recipe), "--infra", str(infra), f"infra.namespace={namespace}", *kube_args(kube)]
    governance = ["infra.resourceQuota.enabled=true", "infra.resourceQuota.hard={pods: '10'}"]
    code, out, err = cli("render", *args, *governance, "--dry-run")
    assert (code, err) == (0, "")
    assert "ResourceQuota/dockyard-quota: accepted (server dry run)" in out  # render-only kinds too
    assert "RayJob/grpo: accepted (server dry run)" in out
    assert kube.api("GET", f"{RAY}/{namespace}/rayjobs")["items"] == []  # nothing changed
    code, _, err = cli("render", *args, "infra.kuberay.spec.headGroupSpec.bogus=1", "--dry-run")
    assert code == 2 and "server dry run of RayJob/grpo" in err


# -- run (rayjob mode) flags --------------------------------------------------------------------


def test_rayjob_name_shutdown_and_ttl_flags_act(
    cli: Cli, kube: LocalCluster, kuberay_crds: Path, namespace: str, pair: Callable[..., tuple[Path, Path]]
) -> None:
    recipe, infra = pair({"mode": "rayjob", "entrypoint": OK})
    args = [str(recipe), "--infra", str(infra), f"infra.namespace={namespace}", *kube_args(kube)]
    code, out, err = cli(
        "run", *args, "--rayjob-name", "grpo-try2", "--no-shutdown", "--ttl", "60", "--no-wait"
    )
    assert (code, err) == (0, ""), out
    job = kube.api("GET", f"{RAY}/{namespace}/rayjobs/grpo-try2")
    assert job["spec"]["shutdownAfterJobFinishes"] is False
    assert job["spec"]["ttlSecondsAfterFinished"] == 60
    code, _, err = cli("run", *args, "--rayjob-name", "Bad_Name", "--no-wait")
    assert code == 2 and "--rayjob-name" in err and "DNS-1035" in err


# -- status -------------------------------------------------------------------------------------


def test_status_shows_head_and_worker_pod_phases(
    cli: Cli, kube: LocalCluster, kuberay_crds: Path, namespace: str, pair: Callable[..., tuple[Path, Path]]
) -> None:
    recipe, infra = pair({"mode": "bringup", "entrypoint": OK})
    args = [str(recipe), "--infra", str(infra), f"infra.namespace={namespace}", *kube_args(kube)]
    assert cli("cluster", "up", *args, "--no-wait")[0] == 0
    _, out, _ = cli("status", *args)
    assert "RayCluster grpo pods:" in out and "head    -  (no pod yet)" in out
    ray_pod(kube, namespace, "grpo-head-x", "head")
    ray_pod(kube, namespace, "grpo-trainer-y", "worker", "trainer")
    wait_running(kube, namespace, "grpo-head-x")
    wait_running(kube, namespace, "grpo-trainer-y")
    _, out, _ = cli("status", *args)
    lines = [ln.strip() for ln in out.splitlines()]
    assert any(re.fullmatch(r"head +grpo-head-x +Running.*", ln) for ln in lines), out
    assert any(re.fullmatch(r"worker +grpo-trainer-y +Running.* group=trainer", ln) for ln in lines), out
    assert any(ln.startswith("sandbox pool sbx pods: 1 Running") for ln in lines), out


# -- run (bringup / attach) with the real Ray head ----------------------------------------------


@pytest.fixture
def bringup(
    cli: Cli,
    kube: LocalCluster,
    kuberay_crds: Path,
    namespace: str,
    ray_head: str,
    pair: Callable[..., tuple[Path, Path]],
) -> Callable[..., tuple[int, str, str]]:
    recipe, infra = pair({"mode": "bringup", "entrypoint": OK})
    head_service(kube, namespace)

    def run(verb: str, *extra: str) -> tuple[int, str, str]:
        args = [str(recipe), "--infra", str(infra), f"infra.namespace={namespace}", *kube_args(kube)]
        tail = ["--ray-address", ray_head, "--poll", "0.2"] if verb.split()[0] in ("run", "job") else []
        return cli(*verb.split(), *args, *extra, *tail)

    return run


def test_upload_sends_the_working_dir_and_the_job_reads_a_file_from_it(
    bringup: Callable[..., tuple[int, str, str]], tmp_path: Path, ray_head: str
) -> None:
    repo = tmp_path / "repo"
    (repo / "data").mkdir(parents=True)
    (repo / "data" / "words.txt").write_text("uploaded-words\n")
    (repo / "data" / "__pycache__").mkdir()
    (repo / "data" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    reader = "infra.launch.entrypoint=python -c \"print(open('data/words.txt').read().strip())\""
    code, out, err = bringup(
        "run", reader, "--code-source", "upload", "--repo-root", str(repo), "--run-id", "up-1"
    )
    assert (code, err) == (0, ""), out
    assert re.search(r"working dir .*: 2 files, \d+ KiB \(uploaded\)", out)  # words.txt + the recipe
    assert out.splitlines()[-1].endswith("Ray job up-1: SUCCEEDED (Job finished successfully.)")

    async def check() -> dict[str, Any]:
        async with RayJobsClient(ray_head) as ray:
            assert "uploaded-words" in await ray.logs("up-1")
            return await ray.info("up-1")

    info = asyncio.run(check())
    assert info["runtime_env"]["working_dir"].startswith("gcs://_ray_pkg_")
    assert info["runtime_env"]["env_vars"]["DOCKYARD_K8S_RUN_ID"] == "up-1"
    handle = handles.load("up-1")
    assert handle is not None and (handle.kind, handle.cluster) == ("rest", "grpo")


def test_code_in_the_image_runs_from_code_path_and_run_id_is_the_submission_id(
    bringup: Callable[..., tuple[int, str, str]], tmp_path: Path
) -> None:
    code_dir = tmp_path / "baked"
    code_dir.mkdir()
    (code_dir / "marker.txt").write_text("from-code-path\n")
    reader = "infra.launch.entrypoint=cat marker.txt"
    code, out, err = bringup(
        "run", reader, "--code-source", "image", "--code-path", str(code_dir), "--run-id", "img-1"
    )
    assert (code, err) == (0, ""), out
    assert "code-source=image" in out and "submitted Ray job img-1 to grpo" in out
    code, out, _ = bringup("job logs", "img-1")
    assert code == 0 and "from-code-path" in out


def test_replace_stops_the_running_job_and_job_verbs_find_runs_by_recipe(
    bringup: Callable[..., tuple[int, str, str]],
) -> None:
    sleeper = "infra.launch.entrypoint=sleep 120"
    code, out, err = bringup(
        "run", sleeper, "--no-wait", "--run-id", "long-1", "--code-source", "image", "--code-path", "/"
    )
    assert (code, err) == (0, ""), out
    code, out, _ = bringup("job list")
    assert code == 0 and re.search(r"^long-1\s+(PENDING|RUNNING)", out, re.M)
    code, out, err = bringup(
        "run", "--replace", "--run-id", "next-1", "--code-source", "image", "--code-path", "/"
    )
    assert (code, err) == (0, ""), out
    assert "--replace: stop requested for Ray job long-1" in out
    assert "--replace: Ray job long-1 STOPPED" in out
    assert out.index("--replace: Ray job long-1 STOPPED") < out.index("submitted Ray job next-1")
    code, out, _ = bringup("job logs")  # the recipe's latest run
    assert code == 0 and "dockyard-ok" in out
    code, out, _ = bringup(
        "run", sleeper, "--no-wait", "--run-id", "long-2", "--code-source", "image", "--code-path", "/"
    )
    code, out, err = bringup("job stop", "--force")  # latest run, without waiting
    assert (code, err) == (0, "")
    assert "stop requested for Ray job long-2" in out


def test_recreate_re_applies_a_drifted_cluster(
    bringup: Callable[..., tuple[int, str, str]], kube: LocalCluster, namespace: str
) -> None:
    assert bringup("cluster up", "--no-wait")[0] == 0
    path = f"{RAY}/{namespace}/rayclusters/grpo"
    first = kube.api("GET", path)["metadata"]["uid"]
    code, out, _ = bringup("cluster up", "--no-wait")
    assert code == 0 and "differs" not in out  # unchanged: applied in place
    assert kube.api("GET", path)["metadata"]["uid"] == first
    drift = {
        "spec": {
            "workerGroupSpecs": [
                {
                    "groupName": "trainer",
                    "replicas": 3,
                    "template": {"spec": {"containers": [{"name": "w", "image": "other"}]}},
                }
            ]
        }
    }
    kube.api("PATCH", path, drift, content_type="application/merge-patch+json")
    code, out, _ = bringup("cluster up", "--no-wait")
    assert code == 0 and "warning: RayCluster grpo differs from the infra; reusing it as it is" in out
    reused = kube.api("GET", path)
    assert reused["metadata"]["uid"] == first and len(reused["spec"]["workerGroupSpecs"]) == 1  # untouched
    code, out, _ = bringup("cluster up", "--no-wait", "--recreate")
    assert code == 0 and "--recreate: RayCluster grpo differs from the infra; deleting it" in out
    live = kube.api("GET", path)
    assert live["metadata"]["uid"] != first
    assert [g["groupName"] for g in live["spec"]["workerGroupSpecs"]] == ["trainer", "inference"]


def test_exec_submitter_needs_a_running_head_pod(
    bringup: Callable[..., tuple[int, str, str]], kube: LocalCluster, namespace: str
) -> None:
    batch = ("--mode", "batch", "--code-path", "/opt/code", "--run-id", "ex-1")
    code, _, err = bringup("run", *batch)
    assert code == 2 and "no running head pod for RayCluster grpo" in err
    ray_pod(kube, namespace, "grpo-head-ex", "head")
    wait_running(kube, namespace, "grpo-head-ex")
    code, _, err = bringup("run", *batch)  # kwok runs no containers: exec cannot reach one
    assert code == 2 and "kubectl exec into grpo-head-ex failed" in err
    code, _, err = bringup("run", "--submitter", "exec", "--code-source", "upload")
    assert code == 2 and "--submitter exec cannot upload the working dir" in err


# -- dev ----------------------------------------------------------------------------------------


def workspace(kube: LocalCluster, namespace: str) -> None:
    """A bound workspace PVC and its PV."""
    pv = f"ws-{namespace}"
    kube.api(
        "POST",
        "/api/v1/persistentvolumes",
        {
            "metadata": {"name": pv},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "manual",
                "hostPath": {"path": f"/tmp/{pv}"},
                "claimRef": {"namespace": namespace, "name": "dockyard-workspace"},
            },
        },
    )
    kube.api(
        "POST",
        f"/api/v1/namespaces/{namespace}/persistentvolumeclaims",
        {
            # bound as the PV controller would bind it (the test control plane runs none)
            "metadata": {
                "name": "dockyard-workspace",
                "annotations": {"pv.kubernetes.io/bind-completed": "yes"},
            },
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "manual",
                "volumeName": pv,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    )
    for path in (
        f"/api/v1/persistentvolumes/{pv}",
        f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/dockyard-workspace",
    ):
        kube.api(
            "PATCH",
            f"{path}/status",
            {"status": {"phase": "Bound"}},
            content_type="application/merge-patch+json",
        )


def test_dev_pod_created_found_again_and_deleted(cli: Cli, kube: LocalCluster, namespace: str) -> None:
    workspace(kube, namespace)
    args = ["-n", namespace, *kube_args(kube), "--poll", "0.2", "--label", "sim.nymph.io/run=1h"]
    code, out, err = cli("dev", "connect", *args, "--image", "img:1")
    pod = kube.api("GET", f"/api/v1/namespaces/{namespace}/pods/tester-dev-pod")
    assert pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "dockyard-workspace"
    assert pod["spec"]["containers"][0]["envFrom"] == [
        {"secretRef": {"name": "tester-secrets", "optional": True}}
    ]
    assert pod["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "dockyard-k8s"
    assert "creating dev pod tester-dev-pod" in out and "dev pod tester-dev-pod: Running" in out
    # kwok runs no container: the interactive shell cannot start, and says so
    assert code == 2 and "the shell in dev pod tester-dev-pod ended with exit" in err
    code, out, _ = cli("dev", "connect", *args, "--image", "img:2")
    assert "creating" not in out
    assert "warning: dev pod tester-dev-pod runs image img:1, not img:2" in out
    code, out, err = cli("dev", "stop", "-n", namespace, *kube_args(kube))
    assert (code, err) == (0, "") and "deleted dev pod tester-dev-pod" in out
    code, out, _ = cli("dev", "stop", "-n", namespace, *kube_args(kube))
    assert code == 0 and "no dev pod tester-dev-pod" in out


def test_setup_secrets_creates_then_updates_printing_key_names_only(
    cli: Cli, kube: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    key = tmp_path / "id_ed25519"
    key.write_text("PRIVATE-KEY-MATERIAL\n")
    base = ["-n", namespace, *kube_args(kube)]
    code, _, err = cli("dev", "setup-secrets", "HF_TOKEN=hf-secret-1", *base)
    assert code == 2 and "needs: WANDB_API_KEY, --ssh-key FILE" in err and "hf-secret-1" not in err
    code, out, err = cli(
        "dev",
        "setup-secrets",
        "HF_TOKEN=hf-secret-1",
        "WANDB_API_KEY=wb-secret-2",
        "--ssh-key",
        str(key),
        *base,
    )
    assert (code, err) == (0, "")
    assert out.strip() == (
        f"created secret tester-secrets in {namespace} "
        "(keys: HF_TOKEN, SSH_KEY_CONTENT, SSH_KEY_NAME, WANDB_API_KEY)"
    )
    code, out, err = cli("dev", "setup-secrets", "WANDB_API_KEY=wb-secret-3", "EXTRA=x-secret-4", *base)
    assert (code, err) == (0, "")
    assert out.strip() == f"updated secret tester-secrets in {namespace} (keys: EXTRA, WANDB_API_KEY)"
    for text in (out, err):
        assert not any(
            s in text for s in ("hf-secret-1", "wb-secret-2", "wb-secret-3", "x-secret-4", "PRIVATE")
        )
    secret = kube.api("GET", f"/api/v1/namespaces/{namespace}/secrets/tester-secrets")
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert data["HF_TOKEN"] == "hf-secret-1" and data["WANDB_API_KEY"] == "wb-secret-3"
    assert data["EXTRA"] == "x-secret-4" and data["SSH_KEY_NAME"] == "id_ed25519"


# -- cluster dashboard --------------------------------------------------------------------------


def test_dashboard_error_paths(
    cli: Cli, kube: LocalCluster, kuberay_crds: Path, namespace: str, pair: Callable[..., tuple[Path, Path]]
) -> None:
    base = ["-n", namespace, *kube_args(kube), "--timeout", "2"]
    code, _, err = cli("cluster", "dashboard", "grpo", *base)
    assert code == 2 and "RayCluster grpo not found" in err
    recipe, infra = pair({"mode": "bringup", "entrypoint": OK})
    args = [str(recipe), "--infra", str(infra), f"infra.namespace={namespace}", *kube_args(kube)]
    assert cli("cluster", "up", *args, "--no-wait")[0] == 0
    head_service(kube, namespace)
    code, _, err = cli("cluster", "dashboard", "grpo", *base)
    assert code == 2 and "the head pod of RayCluster grpo is not ready in time" in err
    ray_pod(kube, namespace, "grpo-head-db", "head")
    wait_running(kube, namespace, "grpo-head-db")
    code, _, err = cli("cluster", "dashboard", "grpo", *base, "--port", "0")
    # kwok gives the pod no container to forward to
    assert code == 2 and "kubectl port-forward to service/grpo-head-svc" in err
