"""dockyard jobs that really run: a real KubeRay operator reconciles what nymph renders on the real
node (containerd + runc), in the Ray image built here.

One namespace and one ``nymph dockyard run`` serve the module: the sandbox pool comes up, the
RayJob's head starts, the entrypoint runs and the RayJob ends SUCCEEDED; the tests then read its
output back through nymph's own commands and check, from inside a sandbox container, that the
hardening nymph renders is what the kernel enforces.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from nymph.cli import main
from nymph.dockyard.render import plan
from nymph.errors import NymphError
from nymph.localcluster import LocalCluster
from nymph.localcluster.kuberay import KubeRayOperator
from tests.launch.test_real_node import python_image
from tests.support.kube_fixtures import new_namespace
from tests.support.rayinfra import MARKER, SANDBOX_UID, infra

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]


@dataclass
class Ran:
    kube: LocalCluster
    namespace: str
    args: list[str]
    code: int
    out: str
    err: str
    seconds: float


@pytest.fixture(scope="module")
def ran(
    real_kube: LocalCluster,
    kuberay_operator: KubeRayOperator,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Ran]:
    node = real_kube.real_node
    assert node is not None
    ns = new_namespace(real_kube)
    work = tmp_path_factory.mktemp("dockyard-ray")
    (work / "recipe.yaml").write_text("grpo: {max_num_steps: 1}\n")
    (work / "run.infra.yaml").write_text(yaml.safe_dump(infra(node)))
    args = [str(work / "recipe.yaml"), "--infra", str(work / "run.infra.yaml"), f"infra.namespace={ns}"]
    out_file, err_file = work / "run.out", work / "run.err"
    started = time.monotonic()
    with (
        out_file.open("w") as out,
        err_file.open("w") as err,
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        code = main(["dockyard", "run", *args, "--timeout", "600", "--kubeconfig", str(real_kube.kubeconfig)])
    try:
        yield Ran(
            real_kube, ns, args, code, out_file.read_text(), err_file.read_text(), time.monotonic() - started
        )
    finally:
        real_kube.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.fixture
def nymph(ran: Ran, capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str, str]]:
    capsys.readouterr()

    def run(*argv: str) -> tuple[int, str, str]:
        code = main([*argv, "--kubeconfig", str(ran.kube.kubeconfig)])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def _explain(ran: Ran) -> str:
    pods = ran.kube.kubectl("get", "pods", "-n", ran.namespace, "-o", "wide", check=False).stdout
    job = ran.kube.kubectl("get", "rayjob", "-n", ran.namespace, "-o", "yaml", check=False).stdout
    return f"exit {ran.code}\nstdout:\n{ran.out[-3000:]}\nstderr:\n{ran.err[-3000:]}\n{pods}\n{job[-3000:]}"


def test_dockyard_run_reaches_succeeded_and_the_output_reads_back(
    ran: Ran, nymph: Callable[..., tuple[int, str, str]]
) -> None:
    """``nymph dockyard run`` of a rayjob recipe waits for the pool, hands the RayJob to the
    operator and follows it to SUCCEEDED; ``nymph dockyard job logs`` then shows the
    entrypoint's own output, read from the head through the Jobs REST API, and ``nymph
    dockyard logs`` the head's."""
    assert ran.code == 0, _explain(ran)
    assert "sandbox pool sbx: 2/2 ready" in ran.out
    assert ran.out.rstrip().endswith("RayJob grpo succeeded"), _explain(ran)
    job = ran.kube.api("GET", f"/apis/ray.io/v1/namespaces/{ran.namespace}/rayjobs/grpo")
    assert (job["status"]["jobDeploymentStatus"], job["status"]["jobStatus"]) == ("Complete", "SUCCEEDED")

    code, out, err = nymph("dockyard", "job", "list", *ran.args)
    assert code == 0, err
    assert job["status"]["jobId"] in out and "SUCCEEDED" in out, out
    code, out, err = nymph("dockyard", "job", "logs", job["status"]["jobId"], *ran.args)
    assert code == 0, err
    assert MARKER in out
    code, out, err = nymph("dockyard", "logs", *ran.args, "--source", "head", "--tail", "50")
    assert code == 0, err
    assert "[pod/grpo-" in out and "Ray runtime started" in out, out[-2000:]


def _sandbox_pods(ran: Ran) -> list[dict[str, Any]]:
    got = ran.kube.api(
        "GET", f"/api/v1/namespaces/{ran.namespace}/pods?labelSelector=app.kubernetes.io/name%3Dsbx"
    )
    return [p for p in got["items"] if not p["metadata"].get("deletionTimestamp")]


def test_the_sandbox_hardening_is_enforced_inside_the_container(ran: Ran) -> None:
    """From inside a running sandbox container: no effective capabilities, no-new-privileges
    set, seccomp in filter mode, and (runAsNonRoot) a non-zero uid."""
    assert ran.code == 0, _explain(ran)
    pods = _sandbox_pods(ran)
    assert len(pods) == 2 and all(p["status"]["phase"] == "Running" for p in pods)
    name = pods[0]["metadata"]["name"]
    res = ran.kube.kubectl(
        "exec",
        "-n",
        ran.namespace,
        name,
        "--",
        "sh",
        "-c",
        "grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status; id -u",
    )
    lines = res.stdout.split()
    fields = dict(zip(lines[0:6:2], lines[1:6:2], strict=True))
    assert fields == {"CapEff:": "0000000000000000", "NoNewPrivs:": "1", "Seccomp:": "2"}, res.stdout
    assert lines[6] == str(SANDBOX_UID)


def test_the_sandbox_pdb_refuses_the_second_eviction(ran: Ran) -> None:
    """With ``maxUnavailable: 1`` the Eviction API lets one sandbox Pod go and refuses the next
    (429) while the first is being replaced."""
    assert ran.code == 0, _explain(ran)
    pods = [p["metadata"]["name"] for p in _sandbox_pods(ran)]
    deadline = time.monotonic() + 60
    while True:  # the disruption controller must have counted the healthy pods first
        pdb = ran.kube.api("GET", f"/apis/policy/v1/namespaces/{ran.namespace}/poddisruptionbudgets/sbx-pdb")
        if (pdb.get("status") or {}).get("disruptionsAllowed") == 1:
            break
        assert time.monotonic() < deadline, pdb.get("status")
        time.sleep(0.2)

    def evict(pod: str) -> str:
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod, "namespace": ran.namespace},
        }
        try:
            ran.kube.api("POST", f"/api/v1/namespaces/{ran.namespace}/pods/{pod}/eviction", body)
        except NymphError as exc:
            return str(exc)
        return "ok"

    assert evict(pods[0]) == "ok"
    refused = evict(pods[1])
    assert "HTTP 429" in refused and "disruption budget" in refused.lower(), refused


def _free_the_cpus(ran: Ran) -> None:
    """The first test's Ray cluster is done with: its head would only compete for the two CPUs
    with the next one's (a head that misses Ray's fixed 30 s start-up wait restarts)."""
    ran.kube.kubectl(
        "delete", "rayclusters.ray.io", "-n", ran.namespace, "--all", "--wait=false", check=False
    )


def _get_from_a_pod(kube: LocalCluster, ns: str, node: str, url: str) -> str:
    """What an HTTP GET of ``url`` answers from inside a Pod on the node (its body)."""
    name = f"probe-{secrets.token_hex(3)}"
    fetch = f"import urllib.request; print(urllib.request.urlopen({url!r}, timeout=30).read().decode())"
    pod = {
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [{"name": "get", "image": python_image(kube), "command": ["python3", "-c", fetch]}],
        },
    }
    kube.api("POST", f"/api/v1/namespaces/{ns}/pods", pod)
    deadline = time.monotonic() + 90
    while (phase := kube.api("GET", f"/api/v1/namespaces/{ns}/pods/{name}")["status"].get("phase")) not in (
        "Succeeded",
        "Failed",
    ):
        assert time.monotonic() < deadline, f"the probe Pod is still {phase}"
        time.sleep(0.5)
    logs = kube.kubectl("logs", "-n", ns, name).stdout
    kube.api("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}")  # not one of the cluster's Pods
    assert phase == "Succeeded", logs
    return logs


def test_cluster_up_then_run_attached_through_the_jobs_api_then_down(
    ran: Ran, nymph: Callable[..., tuple[int, str, str]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """``cluster up`` waits until the operator reports the RayCluster ready, its worker joined to
    the head (whose Service name the local cluster DNS resolves); ``run`` in attach
    mode submits the entrypoint to its head through the Jobs REST API (over a port-forward) and
    follows the job to its end, and ``job logs`` shows its output; from inside a Pod the
    in-cluster endpoint nymph would use there answers for that job; ``cluster down`` removes
    the cluster, its Pods and the pool."""
    kube, node = ran.kube, ran.kube.real_node
    assert node is not None
    _free_the_cpus(ran)
    ns = new_namespace(kube)
    work = tmp_path_factory.mktemp("dockyard-up")
    spec = infra(node)
    spec["launch"] = {"mode": "bringup"}
    spec["sandbox"]["replicas"] = 1
    spec["kuberay"]["name"] = "up"
    trainer = spec["kuberay"]["spec"]["workerGroupSpecs"][0]
    trainer["replicas"] = 1
    trainer["rayStartParams"] = {"num-cpus": "1", "object-store-memory": "100000000"}
    (work / "recipe.yaml").write_text("grpo: {max_num_steps: 1}\n")
    (work / "infra.yaml").write_text(yaml.safe_dump(spec))
    args = [str(work / "recipe.yaml"), "--infra", str(work / "infra.yaml"), f"infra.namespace={ns}"]
    try:
        code, out, err = nymph("dockyard", "cluster", "up", *args, "--timeout", "400")
        assert code == 0, out + err
        assert out.rstrip().endswith(f"RayCluster up is ready in {ns}"), out
        assert "workers=1/1" in out  # the worker found its head through the cluster DNS

        attach = [*args, "infra.launch.mode=attach", "infra.launch.attach=up"]
        entry = f"infra.launch.entrypoint=python -c \"print('{MARKER}-attached')\""
        code, out, err = nymph(
            "dockyard", "run", *attach, entry, "--mode", "interactive", "--code-source", "image",
            "--code-path", "/tmp", "--run-id", "attached-1", "--timeout", "300",
        )  # fmt: skip
        assert code == 0, out + err
        assert "Ray job attached-1: SUCCEEDED" in out, out
        code, out, err = nymph("dockyard", "job", "logs", "attached-1", *attach)
        assert code == 0, err
        assert f"{MARKER}-attached" in out
        # The in-cluster endpoint, which nymph uses from inside a Pod instead of a port-forward:
        # the head Service's cluster name answers the Jobs REST API there, with that job.
        svc = kube.api("GET", f"/api/v1/namespaces/{ns}/services/{plan.head_service_name('up')}")
        url = plan.in_cluster_url(svc["metadata"]["name"], namespace=ns, port=plan.dashboard_port(svc))
        job = json.loads(_get_from_a_pod(kube, ns, node, f"{url}/api/jobs/attached-1"))
        assert (job["submission_id"], job["status"]) == ("attached-1", "SUCCEEDED"), job

        code, out, err = nymph("dockyard", "cluster", "down", *args, "--timeout", "180")
        assert code == 0, out + err
        assert "raycluster.ray.io/up: deleted" in out

        def running() -> list[str]:  # the pool's Pods go by the garbage collector, after the command
            pods = kube.api("GET", f"/api/v1/namespaces/{ns}/pods")["items"]
            return [p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")]

        deadline = time.monotonic() + 60
        while running() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert running() == []
    finally:
        kube.kubectl("delete", "namespace", ns, "--wait=false", check=False)
