"""What the queue refuses in a dockyard launch before it is queued, over real HTTP to a real
queue: pod templates that ask for the host (privileged, host namespaces, hostPath, hostPort,
extra capabilities) through any free-form field, more replicas than the operator allows, a
recipe built to multiply the render's work, and a provider the launch cannot run on."""

from __future__ import annotations

import copy
import sys
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.queue_helpers import FAST, Queue, add_kind, open_queue

NS = "/v1/namespaces/default"
DOCKYARD = NS + "/providers/kind/dockyard"
INSTANCES = NS + "/providers/kind/instances"
EXAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "examples"
RECIPE: dict[str, Any] = yaml.safe_load((EXAMPLES / "dockyard-grpo-vllm.yaml").read_text())
INFRA: dict[str, Any] = yaml.safe_load((EXAMPLES / "dockyard-grpo-vllm.infra.yaml").read_text())
RAYJOB = "dockyard: RayJob/dockyard-grpo-vllm spec.rayClusterSpec"
SANDBOX = "dockyard: Deployment/dockyard-sandbox spec"


@pytest.fixture
async def kind(tmp_path: Path) -> AsyncIterator[Queue]:
    """A queue on SQLite with a ``dispatch: daemon`` provider ``kind`` (kube namespace jobs), a
    replica cap of 16 and per-pod caps the example fits (its GPU workers ask for 96 CPUs, 768Gi
    and 8 GPUs each)."""
    caps = {"cpu": "128", "memory": "1Ti", "nvidia.com/gpu": "8"}
    settings = replace(FAST, tenancy=replace(FAST.tenancy, max_replicas=16, max_pod_requests=caps))
    q, runner = await open_queue(tmp_path, settings)
    await add_kind(q)
    try:
        yield q
    finally:
        await q.close()
        await runner.cleanup()


def infra_with(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    infra = copy.deepcopy(INFRA)
    change(infra)
    return infra


def head(infra: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = infra["kuberay"]["spec"]["headGroupSpec"]["template"]["spec"]
    return spec


def worker(infra: dict[str, Any], i: int = 0) -> dict[str, Any]:
    spec: dict[str, Any] = infra["kuberay"]["spec"]["workerGroupSpecs"][i]["template"]["spec"]
    return spec


def free_form_sandbox(infra: dict[str, Any], pod: dict[str, Any], **spec: Any) -> None:
    """``sandbox.spec``: a free-form Deployment spec."""
    infra["sandbox"]["spec"] = {"template": {"spec": pod}, **spec}


HOSTILE: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    (
        "privileged head",
        lambda i: head(i)["containers"][0].update(securityContext={"privileged": True}),
        f"{RAYJOB}.headGroupSpec.template.spec.containers[0].securityContext.privileged: "
        "privileged containers are not allowed",
    ),
    (
        "hostNetwork worker",
        lambda i: worker(i).update(hostNetwork=True),
        f"{RAYJOB}.workerGroupSpecs[0].template.spec.hostNetwork: sharing the host's namespaces",
    ),
    (
        "hostPID worker",
        lambda i: worker(i, 1).update(hostPID=True),
        f"{RAYJOB}.workerGroupSpecs[1].template.spec.hostPID:",
    ),
    (
        "hostIPC head",
        lambda i: head(i).update(hostIPC=True),
        f"{RAYJOB}.headGroupSpec.template.spec.hostIPC:",
    ),
    (
        "hostPath / on a worker",
        # (the example's volumes are one YAML alias: replace the list, do not append to it)
        lambda i: worker(i).update(
            volumes=[*worker(i)["volumes"], {"name": "root", "hostPath": {"path": "/"}}]
        ),
        f"{RAYJOB}.workerGroupSpecs[0].template.spec.volumes[1].hostPath: hostPath volumes are not allowed",
    ),
    (
        "hostPort on the head",
        lambda i: head(i)["containers"][0].update(
            ports=[*head(i)["containers"][0]["ports"], {"containerPort": 22, "hostPort": 22}]
        ),
        f"{RAYJOB}.headGroupSpec.template.spec.containers[0].ports[3].hostPort:",
    ),
    (
        "SYS_ADMIN in an init container",
        lambda i: head(i).update(
            initContainers=[{"name": "i", "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}]
        ),
        f"{RAYJOB}.headGroupSpec.template.spec.initContainers[0].securityContext.capabilities.add[0]:",
    ),
    (
        "privileged autoscaler sidecar",
        lambda i: i["kuberay"]["spec"].update(autoscalerOptions={"securityContext": {"privileged": True}}),
        f"{RAYJOB}.autoscalerOptions.securityContext.privileged:",
    ),
    (
        "hostPath workspace",
        lambda i: i.update(workspace={"kind": "hostPath", "hostPath": "/etc", "mountPath": "/ws"}),
        "hostPath volumes are not allowed",
    ),
    (
        "privileged free-form sandbox",
        lambda i: free_form_sandbox(
            i, {"containers": [{"name": "s", "securityContext": {"privileged": True}}]}
        ),
        f"{SANDBOX}.template.spec.containers[0].securityContext.privileged:",
    ),
    (
        "hostPath free-form sandbox",
        lambda i: free_form_sandbox(
            i,
            {
                "containers": [{"name": "s"}],
                "volumes": [{"name": "docker", "hostPath": {"path": "/var/run/docker.sock"}}],
            },
        ),
        f"{SANDBOX}.template.spec.volumes[0].hostPath:",
    ),
]


@pytest.mark.parametrize(
    ("change", "needle"), [(c, n) for _, c, n in HOSTILE], ids=[name for name, _, _ in HOSTILE]
)
async def test_pod_templates_asking_for_the_host_are_refused_naming_the_field(
    kind: Queue, change: Callable[[dict[str, Any]], None], needle: str
) -> None:
    """Every way the free-form fields reach a pod template is held to the Pod policy; the 400
    names the object and the field, and nothing is queued."""
    r = await kind.call("POST", DOCKYARD, json_body={"recipe": RECIPE, "infra": infra_with(change)})
    assert r.status == 400, r.body
    assert r.body["error"] == "invalid_dockyard"
    assert needle in r.body["detail"], r.body["detail"]
    assert (await kind.call("GET", INSTANCES)).body == {"items": []}
    assert await kind.daemon().claim(daemon_id="d1", node="n1", capacity=5, wait=0) == []


def _workers(infra: dict[str, Any], replicas: int, **extra: Any) -> None:
    infra["kuberay"]["spec"]["workerGroupSpecs"][0]["replicas"] = replicas
    infra["kuberay"].update(extra)


@pytest.mark.parametrize(
    ("infra", "needle"),
    [
        (
            infra_with(lambda i: i["sandbox"].update(replicas=10**12)),
            f"{SANDBOX}.replicas: 1000000000000 is more than the 16 replicas allowed here "
            "(the queue's --max-replicas)",
        ),
        (
            infra_with(lambda i: free_form_sandbox(i, {"containers": [{"name": "s"}]}, replicas=17)),
            f"{SANDBOX}.replicas: 17 is more than the 16",
        ),
        (
            infra_with(lambda i: _workers(i, 10**12)),
            f"{RAYJOB}.workerGroupSpecs[0].replicas: 1000000000000 is more than the 16",
        ),
        (
            infra_with(lambda i: i["kuberay"]["spec"]["workerGroupSpecs"][1].update(maxReplicas=1000)),
            f"{RAYJOB}.workerGroupSpecs[1].maxReplicas: 1000 is more than the 16",
        ),
        (
            # split into segments of 4, each under the cap: the whole cluster still counts
            infra_with(lambda i: _workers(i, 16, segmentSize=4)),
            f"{RAYJOB}.workerGroupSpecs: the worker groups ask for 17 pods in all",
        ),
        (
            # too many segments to render at all, whatever the cap
            infra_with(lambda i: _workers(i, 10**12, segmentSize=1)),
            "infra.kuberay.spec.workerGroupSpecs[0].replicas: replicas 1000000000000 in segments",
        ),
        (
            infra_with(lambda i: _workers(i, "12")),  # type: ignore[arg-type]
            f"{RAYJOB}.workerGroupSpecs[0]",
        ),
    ],
    ids=[
        "sandbox",
        "free-form sandbox",
        "worker group",
        "maxReplicas",
        "segments",
        "segment count",
        "string",
    ],
)
async def test_replicas_past_the_cap_are_refused_naming_the_field_and_flag(
    kind: Queue, infra: dict[str, Any], needle: str
) -> None:
    r = await kind.call("POST", DOCKYARD, json_body={"recipe": RECIPE, "infra": infra})
    assert r.status == 400, r.body
    assert r.body["error"] == "invalid_dockyard"
    assert needle in r.body["detail"], r.body["detail"]
    assert (await kind.call("GET", INSTANCES)).body == {"items": []}


async def test_replicas_at_the_cap_are_accepted(kind: Queue) -> None:
    infra = infra_with(lambda i: i["sandbox"].update(replicas=16))
    infra["kuberay"]["spec"]["workerGroupSpecs"][0]["replicas"] = 15  # 15 + 1 inference
    r = await kind.call("POST", DOCKYARD, json_body={"recipe": RECIPE, "infra": infra})
    assert r.status == 202, r.body


def doubling_bomb(levels: int) -> dict[str, Any]:
    """Each key uses the one before twice: resolving the last one takes 2**levels steps."""
    recipe: dict[str, Any] = {"b0": "x"}
    for n in range(1, levels):
        recipe[f"b{n}"] = f"${{b{n - 1}}}${{b{n - 1}}}"
    return recipe


def _render_frames() -> list[str]:
    """Threads executing dockyard spec or render code right now."""
    busy = []
    for ident, frame in sys._current_frames().items():
        f: Any = frame
        while f is not None:
            name = f.f_code.co_filename.replace("\\", "/")
            if "/nymph/dockyard/" in name or "/omegaconf/" in name:
                names = {t.ident: t.name for t in threading.enumerate()}
                busy.append(names.get(ident, str(ident)))
                break
            f = f.f_back
    return busy


async def test_an_interpolation_bomb_is_refused_by_the_budget_and_leaves_no_render_running(
    kind: Queue,
) -> None:
    """A short recipe whose references multiply (2**40 resolutions unbudgeted) is a 400 naming
    the step budget, and no thread is still rendering it once the answer is back."""
    bomb = doubling_bomb(40)
    assert len(yaml.safe_dump(bomb)) < 700
    r = await kind.call("POST", DOCKYARD, json_body={"recipe": {**RECIPE, **bomb}, "infra": INFRA})
    assert r.status == 400, r.body
    assert r.body["error"] == "invalid_dockyard"
    assert "more than 2000 interpolation steps" in r.body["detail"], r.body["detail"]
    assert _render_frames() == []
    assert (await kind.call("GET", INSTANCES)).body == {"items": []}
    # the queue still answers, and a sane launch still goes through
    r = await kind.call("POST", DOCKYARD, json_body={"recipe": RECIPE, "infra": INFRA})
    assert r.status == 202, r.body


async def test_a_dockyard_launch_to_a_direct_provider_is_refused(kind: Queue) -> None:
    """A direct provider has no daemon to apply dockyard objects: a 400 that says which kind of
    provider it needs, instead of a launch that stays queued forever."""
    kubeconfig = yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": "https://192.0.2.10:6443"}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "jobs"}}],
            "current-context": "x",
        }
    )
    r = await kind.call(
        "POST",
        NS + "/providers",
        json_body={
            "name": "direct",
            "launcher": "Kube",
            "dispatch": "direct",
            "kwargs": {"namespace": "jobs", "kubeconfig": kubeconfig},
        },
    )
    assert r.status == 201, r.body
    r = await kind.call(
        "POST", NS + "/providers/direct/dockyard", json_body={"recipe": RECIPE, "infra": INFRA}
    )
    assert r.status == 400, r.body
    assert r.body["error"] == "invalid_dockyard"
    assert "dispatch: daemon" in r.body["detail"] and "dispatch: direct" in r.body["detail"]


def _two_big_sandbox_containers(infra: dict[str, Any]) -> None:
    big = {"resources": {"requests": {"cpu": "100"}}}
    free_form_sandbox(infra, {"containers": [{"name": "a", **big}, {"name": "b", **big}]})


@pytest.mark.parametrize(
    ("infra", "needle"),
    [
        (
            infra_with(
                lambda i: worker(i)["containers"][0].update(resources={"requests": {"nvidia.com/gpu": "16"}})
            ),
            f"{RAYJOB}.workerGroupSpecs[0].template.spec.containers[0].resources.requests.nvidia.com/gpu: "
            "asks for 16 nvidia.com/gpu, more than the 8 one pod may request here (the queue's --max-pod-request)",
        ),
        (
            infra_with(lambda i: head(i)["containers"][0].update(resources={"limits": {"memory": "2Ti"}})),
            f"{RAYJOB}.headGroupSpec.template.spec.containers[0].resources.limits.memory: asks for 2Ti memory",
        ),
        (
            infra_with(_two_big_sandbox_containers),
            f"{SANDBOX}.template.spec.containers: the containers ask for 200 cpu, more than the 128",
        ),
        (
            infra_with(lambda i: head(i)["containers"][0].update(resources={"requests": {"cpu": "lots"}})),
            f"{RAYJOB}.headGroupSpec.template.spec.containers[0].resources.requests.cpu: 'lots' is not a quantity",
        ),
    ],
    ids=["gpus", "memory limit only", "sum of containers", "not a quantity"],
)
async def test_pods_asking_for_more_than_the_per_pod_caps_are_refused(
    kind: Queue, infra: dict[str, Any], needle: str
) -> None:
    r = await kind.call("POST", DOCKYARD, json_body={"recipe": RECIPE, "infra": infra})
    assert r.status == 400, r.body
    assert r.body["error"] == "invalid_dockyard"
    assert needle in r.body["detail"], r.body["detail"]


def test_the_per_pod_caps_come_from_repeatable_flags() -> None:
    from nymph.cli import build_parser
    from nymph.cli.queue import tenancy_settings
    from nymph.errors import ConfigError

    argv = ["queue", "serve", "--max-pod-request", "cpu=64", "--max-pod-request", "nvidia.com/gpu=8"]
    settings = tenancy_settings(build_parser().parse_args(argv))
    assert settings.max_pod_requests == {"cpu": "64", "nvidia.com/gpu": "8"}
    assert tenancy_settings(build_parser().parse_args(["queue", "serve"])).max_pod_requests == {}
    for bad in ("cpu", "cpu=lots", "cpu=0", "=4", "Bad Name=1"):
        with pytest.raises(ConfigError, match="--max-pod-request"):
            tenancy_settings(build_parser().parse_args(["queue", "serve", "--max-pod-request", bad]))
