"""Hostile dockyard launches against the real queue (a subprocess, SQLite file), as a user with
one namespace-scoped token would send them: pod templates that ask for the host through every
free-form field, absurd replica counts, interpolation bombs, a direct provider. Each is a 400
``invalid_dockyard`` naming what is wrong, nothing is queued, and the queue keeps answering."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.queue_peers import Checked, Tenants, start_tenants

pytestmark = [pytest.mark.faults]

EXAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "examples"
RECIPE: dict[str, Any] = yaml.safe_load((EXAMPLES / "dockyard-grpo-vllm.yaml").read_text())
#: the example infra, run as the namespace's default ServiceAccount (the tenants' queue allows
#: no other)
INFRA: dict[str, Any] = {
    k: v
    for k, v in yaml.safe_load((EXAMPLES / "dockyard-grpo-vllm.infra.yaml").read_text()).items()
    if k != "serviceAccount"
}
A = "/v1/namespaces/team-a"


@pytest.fixture(scope="module")
def tenants(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenants]:
    t = start_tenants(tmp_path_factory.mktemp("tenants"))
    try:
        yield t
    finally:
        t.queue.kill()


def _head(i: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = i["kuberay"]["spec"]["headGroupSpec"]["template"]["spec"]
    return spec


def _worker(i: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = i["kuberay"]["spec"]["workerGroupSpecs"][0]["template"]["spec"]
    return spec


def _privileged(c: dict[str, Any]) -> None:
    c["securityContext"] = {"privileged": True}


def _segments_of_one(i: dict[str, Any]) -> None:
    i["kuberay"]["spec"]["workerGroupSpecs"][0]["replicas"] = 10**12
    i["kuberay"]["segmentSize"] = 1


INFRA_CASES: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "privileged head": (lambda i: _privileged(_head(i)["containers"][0]), "securityContext.privileged"),
    "hostNetwork": (lambda i: _worker(i).update(hostNetwork=True), "hostNetwork"),
    "hostPID": (lambda i: _head(i).update(hostPID=True), "hostPID"),
    "hostIPC": (lambda i: _head(i).update(hostIPC=True), "hostIPC"),
    "hostPath /": (
        lambda i: _worker(i).update(volumes=[{"name": "root", "hostPath": {"path": "/"}}]),
        "hostPath volumes are not allowed",
    ),
    "hostPort": (
        lambda i: _head(i)["containers"][0].update(ports=[{"containerPort": 22, "hostPort": 22}]),
        "hostPort",
    ),
    "SYS_ADMIN": (
        lambda i: _head(i)["containers"][0].update(securityContext={"capabilities": {"add": ["SYS_ADMIN"]}}),
        "capabilities.add[0]",
    ),
    "privileged autoscaler": (
        lambda i: i["kuberay"]["spec"].update(autoscalerOptions={"securityContext": {"privileged": True}}),
        "autoscalerOptions.securityContext.privileged",
    ),
    "hostPath workspace": (
        lambda i: i.update(workspace={"kind": "hostPath", "hostPath": "/", "mountPath": "/ws"}),
        "hostPath volumes are not allowed",
    ),
    "privileged free-form sandbox": (
        lambda i: i["sandbox"].update(
            spec={
                "template": {"spec": {"containers": [{"name": "s", "securityContext": {"privileged": True}}]}}
            }
        ),
        "Deployment/dockyard-sandbox spec.template.spec.containers[0].securityContext.privileged",
    ),
    "AppArmor unconfined": (
        lambda i: i["kuberay"]["spec"]["headGroupSpec"]["template"].update(
            metadata={
                "annotations": {"container.apparmor.security.beta.kubernetes.io/ray-head": "unconfined"}
            }
        ),
        "headGroupSpec.template.metadata.annotations[container.apparmor.security.beta.kubernetes.io/ray-head]",
    ),
    "sandbox replicas 10^12": (lambda i: i["sandbox"].update(replicas=10**12), "--max-replicas"),
    "worker replicas 10^12": (
        lambda i: i["kuberay"]["spec"]["workerGroupSpecs"][0].update(replicas=10**12),
        "--max-replicas",
    ),
    "10^12 replicas in segments of 1": (_segments_of_one, "worker groups; at most"),
}


def _doubling(levels: int, seed: str = "x") -> dict[str, str]:
    bomb = {"b0": seed}
    for n in range(1, levels):
        bomb[f"b{n}"] = f"${{b{n - 1}}}${{b{n - 1}}}"
    return bomb


RECIPE_CASES: dict[str, tuple[dict[str, Any], str]] = {
    "doubling bomb": (_doubling(40), "interpolation steps"),
    "size bomb": (_doubling(30, seed="y" * 30_000), "characters"),
    "bomb through resolver defaults": (
        {
            "c0": "x",
            **{
                f"c{n}": f"${{oc.env:NOPE,${{c{n - 1}}}}}${{oc.env:NOPE,${{c{n - 1}}}}}" for n in range(1, 40)
            },
        },
        "interpolation steps",
    ),
}


def test_hostile_dockyard_launches_are_refused_naming_the_field(tenants: Tenants) -> None:
    http = Checked(tenants.url)
    tok = tenants.user["team-a"]
    path = f"{A}/providers/local/dockyard"
    bodies: dict[str, tuple[dict[str, Any], str]] = {}
    for what, (change, needle) in INFRA_CASES.items():
        infra = copy.deepcopy(INFRA)
        change(infra)
        bodies[what] = ({"recipe": RECIPE, "infra": infra}, needle)
    for what, (extra, needle) in RECIPE_CASES.items():
        bodies[what] = ({"recipe": {**RECIPE, **extra}, "infra": INFRA}, needle)
    for what, (body, needle) in bodies.items():
        t0 = time.monotonic()
        resp = http.send("POST", path, token=tok, json_body=body, timeout=60)
        if resp.status_code != 400:
            http.failures.append(f"{what}: {resp.status_code} {resp.text[:200]}")
            continue
        answer = resp.json()
        if answer.get("error") != "invalid_dockyard" or needle not in answer.get("detail", ""):
            http.failures.append(f"{what}: {answer!r:.300}")
        if time.monotonic() - t0 > 30:
            http.failures.append(f"{what}: took {time.monotonic() - t0:.0f}s to refuse")
    # a direct provider cannot run a dockyard launch at all
    kubeconfig = yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": "https://192.0.2.10:6443"}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "jobs-team-a"}}],
            "current-context": "x",
        }
    )
    resp = http.send(
        "POST",
        f"{A}/providers",
        token=tok,
        bad=False,
        json_body={
            "name": "direct",
            "launcher": "Kube",
            "dispatch": "direct",
            "kwargs": {"namespace": "jobs-team-a", "kubeconfig": kubeconfig},
        },
    )
    if resp.status_code == 201:
        resp = http.send(
            "POST", f"{A}/providers/direct/dockyard", token=tok, json_body={"recipe": RECIPE, "infra": INFRA}
        )
        if resp.status_code != 400 or "dispatch: daemon" not in resp.json().get("detail", ""):
            http.failures.append(f"direct provider: {resp.status_code} {resp.text[:200]}")
    # nothing was queued, and a sane launch still is
    listed = http.send("GET", f"{A}/providers/local/instances", token=tok, bad=False)
    if listed.json().get("items"):
        http.failures.append(f"queued anyway: {listed.text[:300]}")
    resp = http.send("POST", path, token=tok, bad=False, json_body={"recipe": RECIPE, "infra": INFRA})
    if resp.status_code != 202:
        http.failures.append(f"a sane launch after the hostile ones: {resp.status_code} {resp.text[:200]}")
    assert not http.failures, http.failures
