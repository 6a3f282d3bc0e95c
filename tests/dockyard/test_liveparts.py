"""The pure parts of the live layer: plans, teardown order, status lines, daemon dispatch,
address and output parsing, error lines. No cluster."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any, cast

import pytest

from nymph.cli import main
from nymph.dockyard.errors import DockyardConfigError, DockyardLiveError
from nymph.dockyard.live import status
from nymph.dockyard.live.endpoint import _FORWARDING, route
from nymph.dockyard.live.kubectl import explain, in_cluster, json_items
from nymph.dockyard.live.rayapi import normalize_address
from nymph.dockyard.live.run import teardown_order
from nymph.dockyard.render import plan
from nymph.dockyard.render.k8s import MANAGED_BY_KEY
from nymph.dockyard.render.manifests import render_manifests
from nymph.dockyard.render.task import DOCKYARD_ROLE_RULES, dockyard_task_manifests
from nymph.dockyard.spec.enums import PortForwardMode
from nymph.dockyard.spec.parse import parse_infra


def refs(manifests: list[dict[str, Any]]) -> list[str]:
    return [plan.ref(m) for m in manifests]


def rendered(infra: dict[str, Any]) -> list[Any]:
    return list(render_manifests(infra=parse_infra(infra)))


# -- plan --------------------------------------------------------------------------------


def test_plan_splits_render_only_pool_and_ray_object(infra_dict: dict[str, Any]) -> None:
    infra_dict["resourceQuota"] = {"enabled": True, "hard": {"pods": 10}}
    infra_dict["limitRange"] = {"enabled": True, "default": {"cpu": 1}}
    p = plan.plan(rendered(infra_dict))
    assert [m["kind"] for m in p.render_only] == ["ResourceQuota", "LimitRange"]
    assert refs(list(p.first)) == [
        "Deployment/sbx",
        "Service/sbx",
        "NetworkPolicy/sbx-netpol",
        "PodDisruptionBudget/sbx-pdb",
    ]
    assert p.ray is not None and plan.ref(p.ray) == "RayJob/grpo"
    assert refs(p.applied) == [*refs(list(p.first)), "RayJob/grpo"]
    deployment = p.sandbox_deployment()
    assert deployment is not None and plan.sandbox_selector(deployment) == "app.kubernetes.io/name=sbx"


def test_plan_in_attach_mode_has_no_ray_object(infra_dict: dict[str, Any]) -> None:
    infra_dict["launch"] = {"mode": "attach", "attach": "existing"}
    p = plan.plan(rendered(infra_dict))
    assert p.ray is None
    assert refs(p.applied) == refs(list(p.first))


def test_teardown_deletes_last_applied_first(infra_dict: dict[str, Any]) -> None:
    infra_dict["launch"]["mode"] = "bringup"
    infra_dict["kuberay"]["pdb"] = {"enabled": True, "maxUnavailable": 0}
    infra_dict["resourceQuota"] = {"enabled": True, "hard": {"pods": 10}}
    order = teardown_order(rendered(infra_dict))
    assert refs(order) == [
        "RayJob/grpo",
        "RayCluster/grpo",
        "PodDisruptionBudget/grpo-pdb",
        "PodDisruptionBudget/sbx-pdb",
        "NetworkPolicy/sbx-netpol",
        "Service/sbx",
        "Deployment/sbx",
    ]
    assert all(m["metadata"]["namespace"] == "team-a" for m in order)


def test_selectors_and_names() -> None:
    assert plan.head_service_name("grpo") == "grpo-head-svc"
    assert (
        plan.ray_pod_selector("grpo", source=plan.LogSource.HEAD)
        == "ray.io/cluster=grpo,ray.io/node-type=head"
    )
    assert (
        plan.ray_pod_selector("grpo", source=plan.LogSource.WORKER, group="trainer")
        == "ray.io/cluster=grpo,ray.io/group=trainer,ray.io/node-type=worker"
    )
    named = {"spec": {"ports": [{"name": "gcs", "port": 6379}, {"name": "dashboard", "port": 8266}]}}
    assert plan.dashboard_port(named) == 8266
    assert plan.dashboard_port({"spec": {"ports": [{"port": 80}]}}) == 8265
    assert plan.in_cluster_url("h", namespace="ns", port=8265) == "http://h.ns.svc.cluster.local:8265"


def test_sandbox_pools_are_recognised(infra_dict: dict[str, Any]) -> None:
    deployment = plan.plan(rendered(infra_dict)).sandbox_deployment()
    assert deployment is not None and plan.is_sandbox_deployment(deployment)
    other = copy.deepcopy(deployment)
    other["metadata"]["labels"].pop(MANAGED_BY_KEY)
    assert not plan.is_sandbox_deployment(other)


# -- status --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("deployment", "job", "terminal", "succeeded"),
    [
        ("", "", False, False),
        ("Initializing", "", False, False),
        ("Running", "RUNNING", False, False),
        ("Complete", "SUCCEEDED", True, True),
        ("Complete", "FAILED", True, False),
        ("Failed", "", True, False),
        ("ValidationFailed", "", True, False),
        ("Suspended", "", False, False),
    ],
)
def test_rayjob_phase(deployment: str, job: str, terminal: bool, succeeded: bool) -> None:
    phase = status.rayjob_phase({"status": {"jobDeploymentStatus": deployment, "jobStatus": job}})
    assert (phase.terminal, phase.succeeded) == (terminal, succeeded)


def test_rayjob_line_shows_cluster_and_the_failure_message() -> None:
    obj = {
        "status": {
            "jobDeploymentStatus": "Failed",
            "jobStatus": "FAILED",
            "rayClusterName": "grpo-x1",
            "message": "driver\nexited 1",
        }
    }
    assert status.rayjob_phase(obj).line() == "deployment=Failed job=FAILED cluster=grpo-x1 (driver exited 1)"
    assert status.rayjob_phase({}).line() == "deployment=New job=-"


def test_object_lines() -> None:
    assert status.object_line(
        {"kind": "Deployment", "spec": {"replicas": 3}, "status": {"readyReplicas": 2}}
    ) == ("2/3 ready")
    assert status.object_line({"kind": "Deployment", "spec": {"replicas": 3}, "status": {}}) == "0/3 ready"
    svc = {
        "kind": "Service",
        "spec": {"type": "ClusterIP", "clusterIP": "10.0.0.5", "ports": [{"port": 9090}]},
    }
    assert status.object_line(svc) == "ClusterIP 10.0.0.5 port 9090"
    rc = {
        "kind": "RayCluster",
        "status": {
            "state": "ready",
            "desiredWorkerReplicas": 4,
            "availableWorkerReplicas": 3,
            "head": {"serviceName": "g-head-svc"},
        },
    }
    assert status.object_line(rc) == "state=ready workers=3/4 head-svc=g-head-svc"
    assert status.object_line({"kind": "RayCluster"}) == "state=pending"
    assert status.object_line({"kind": "NetworkPolicy"}) == "present"


def test_rows_and_table() -> None:
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    rc = {
        "metadata": {
            "name": "grpo-abc",
            "namespace": "ns",
            "creationTimestamp": "2026-01-01T11:58:00Z",
            "ownerReferences": [{"kind": "RayJob", "name": "grpo"}],
        },
        "status": {
            "state": "ready",
            "desiredWorkerReplicas": 2,
            "availableWorkerReplicas": 2,
            "desiredGPU": "16",
        },
    }
    row = status.raycluster_row(rc, now=now)
    assert row == ["grpo-abc", "ns", "ready", "2/2", "16", "rayjob/grpo", "2m"]
    text = status.table(status.RAYCLUSTER_HEADERS, [row])
    header, line = text.splitlines()
    assert header.split() == list(status.RAYCLUSTER_HEADERS)
    assert line.split() == row
    assert header.index("STATE") == line.index("ready")
    job = {
        "submission_id": "raysubmit_1",
        "status": "SUCCEEDED",
        "start_time": 0,
        "entrypoint": "python  -c 1",
    }
    assert status.ray_job_row(job) == ["raysubmit_1", "SUCCEEDED", "-", "-", "python -c 1"]


@pytest.mark.parametrize(
    ("stamp", "expected"),
    [
        ("2026-01-01T11:59:50Z", "10s"),
        ("2026-01-01T09:00:00Z", "3h"),
        ("2025-12-30T12:00:00Z", "2d"),
        (None, "-"),
    ],
)
def test_age(stamp: str | None, expected: str) -> None:
    assert status.age(stamp, now=datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)) == expected


# -- parsing and error lines ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("127.0.0.1:8265", "http://127.0.0.1:8265"),
        ("http://head:8265/", "http://head:8265"),
        ("https://ray.example:443", "https://ray.example:443"),
    ],
)
def test_normalize_address(given: str, expected: str) -> None:
    assert normalize_address(given) == expected


@pytest.mark.parametrize("bad", ["", "ray://head:10001"])
def test_bad_addresses_are_refused(bad: str) -> None:
    with pytest.raises(DockyardLiveError, match="ray-address"):
        normalize_address(bad)


def test_json_items_reads_single_list_and_concatenated_output() -> None:
    assert json_items('{"kind": "Pod", "a": 1}') == [{"kind": "Pod", "a": 1}]
    assert json_items('{"kind": "List", "items": [{"a": 1}, {"a": 2}]}') == [{"a": 1}, {"a": 2}]
    assert json_items('{"a": 1}\n{\n "a": 2\n}\n') == [{"a": 1}, {"a": 2}]
    assert json_items("") == []
    with pytest.raises(DockyardLiveError):
        json_items("{oops")


@pytest.mark.parametrize(
    ("stderr", "hint"),
    [
        (
            'error: resource mapping not found for name: "g" namespace: "n" from "STDIN": no matches for kind '
            '"RayJob" in version "ray.io/v1"\nensure CRDs are installed first',
            "KubeRay CRDs are not installed",
        ),
        ('Error from server (Forbidden): rayjobs.ray.io "g" is forbidden: User "u" cannot patch', "RBAC"),
        (
            "The connection to the server 127.0.0.1:1 was refused - did you specify the right host",
            "cannot reach",
        ),
        ('Error from server (NotFound): namespaces "nope" not found', "kubectl create namespace nope"),
        ("error: You must be logged in to the server (Unauthorized)", "credentials were rejected"),
    ],
)
def test_explain_is_one_line_with_a_hint(stderr: str, hint: str) -> None:
    err = explain(stderr, doing="apply RayJob/g", namespace="nope")
    assert "\n" not in str(err)
    assert str(err).startswith("apply RayJob/g: ")
    assert hint in str(err)


def test_port_forward_line() -> None:
    found = _FORWARDING.search(b"Forwarding from 127.0.0.1:41234 -> 8265\n")
    assert found is not None and found.group(1) == b"41234"
    assert _FORWARDING.search(b"Forwarding from [::1]:41234 -> 8265\n") is None


def test_in_cluster_only_without_a_kubeconfig() -> None:
    pod = {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}
    assert in_cluster(None, pod)
    assert not in_cluster("/k", pod)
    assert not in_cluster(None, {**pod, "KUBECONFIG": "/k"})
    assert not in_cluster(None, {})


@pytest.mark.parametrize(
    ("mode", "ray_address", "inside", "expected"),
    [
        (PortForwardMode.AUTO, None, False, "forward"),
        (PortForwardMode.AUTO, None, True, "service"),
        (PortForwardMode.KUBECTL_PORT_FORWARD, None, True, "forward"),
        (PortForwardMode.KUBECTL_PORT_FORWARD, None, False, "forward"),
        (PortForwardMode.KUBECTL_RAY_PLUGIN, None, True, "forward"),
        (PortForwardMode.KUBECTL_PORT_FORWARD, "http://head:8265", True, "address"),
        (PortForwardMode.AUTO, "head:8265", False, "address"),
    ],
)
def test_submit_port_forward_chooses_the_route(
    mode: PortForwardMode, ray_address: str | None, inside: bool, expected: str
) -> None:
    assert route(mode=mode, ray_address=ray_address, inside=inside) == expected


# -- daemon dispatch -----------------------------------------------------------------------

RECIPE = {"grpo": {"max_num_steps": 10}, "cluster": {"num_nodes": 2}}


def task_infra(infra_dict: dict[str, Any]) -> dict[str, Any]:
    infra = copy.deepcopy(infra_dict)
    infra.pop("namespace")
    infra["resourceQuota"] = {"enabled": True, "hard": {"pods": 10}}
    return infra


def test_task_manifests_in_apply_order_without_render_only_kinds(infra_dict: dict[str, Any]) -> None:
    out = dockyard_task_manifests(
        recipe=RECIPE, infra=task_infra(infra_dict), overrides=[], namespace="team-b"
    )
    assert refs(out) == [
        "Deployment/sbx",
        "Service/sbx",
        "NetworkPolicy/sbx-netpol",
        "PodDisruptionBudget/sbx-pdb",
        "RayJob/grpo",
    ]
    assert {m["metadata"]["namespace"] for m in out} == {"team-b"}
    env = out[-1]["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "DOCKYARD_SANDBOX_URLS", "value": "http://sbx.team-b.svc.cluster.local:9090"} in env


def test_task_overrides_and_recipe_interpolation(infra_dict: dict[str, Any]) -> None:
    infra = task_infra(infra_dict)
    infra["labels"] = {"nodes": "n${cluster.num_nodes}"}
    out = dockyard_task_manifests(
        recipe=RECIPE,
        infra=infra,
        overrides=["infra.launch.mode=bringup", "cluster.num_nodes=3"],
        namespace="b",
    )
    assert out[-1]["kind"] == "RayCluster"
    assert out[-1]["metadata"]["labels"]["nodes"] == "n3"


def test_task_infra_in_the_recipe_block(infra_dict: dict[str, Any]) -> None:
    recipe = {**RECIPE, "infra": task_infra(infra_dict)}
    out = dockyard_task_manifests(recipe=recipe, infra={}, overrides=[], namespace="b")
    assert out[-1]["kind"] == "RayJob"


def test_task_namespace_must_agree(infra_dict: dict[str, Any]) -> None:
    infra = task_infra(infra_dict)
    infra["namespace"] = "team-b"
    assert dockyard_task_manifests(recipe=RECIPE, infra=infra, overrides=[], namespace="team-b")
    with pytest.raises(
        DockyardConfigError, match="names namespace 'team-b' but the task is dispatched to 'team-c'"
    ):
        dockyard_task_manifests(recipe=RECIPE, infra=infra, overrides=[], namespace="team-c")
    with pytest.raises(DockyardConfigError, match="names namespace 'x'"):
        dockyard_task_manifests(
            recipe=RECIPE, infra=task_infra(infra_dict), overrides=["infra.namespace=x"], namespace="team-c"
        )


def test_task_sees_none_of_the_daemon_environment(
    infra_dict: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DAEMON_SECRET", "s3cret")
    infra = task_infra(infra_dict)
    infra["labels"] = {"team": "${oc.env:DAEMON_SECRET,none}"}
    out = dockyard_task_manifests(recipe=RECIPE, infra=infra, overrides=[], namespace="b")
    assert "s3cret" not in repr(out)
    assert out[0]["metadata"]["labels"]["team"] == "none"


def test_task_errors_name_the_key(infra_dict: dict[str, Any]) -> None:
    infra = task_infra(infra_dict)
    infra["sandbox"]["bogus"] = 1
    with pytest.raises(DockyardConfigError, match=r"sandbox\.bogus|bogus"):
        dockyard_task_manifests(recipe=RECIPE, infra=infra, overrides=[], namespace="b")


def test_role_rules_cover_exactly_the_applied_kinds_with_least_privilege() -> None:
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in DOCKYARD_ROLE_RULES:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    assert set(granted) == {
        ("apps", "deployments"),
        ("", "services"),
        ("networking.k8s.io", "networkpolicies"),
        ("policy", "poddisruptionbudgets"),
        ("ray.io", "rayjobs"),
        ("ray.io", "rayclusters"),
        ("resource.k8s.io", "resourceclaimtemplates"),
        ("resource.nvidia.com", "computedomains"),
    }
    for key, verbs in granted.items():
        # and list on RayJobs alone: the daemon reads which of its launches' RayJobs have ended
        assert verbs == {
            "get",
            "create",
            "patch",
            "delete",
            *(["list"] if key == ("ray.io", "rayjobs") else []),
        }
    assert "*" not in repr(DOCKYARD_ROLE_RULES)


# -- CLI errors that need no cluster ---------------------------------------------------------


def test_job_verbs_need_a_head(capsys: pytest.CaptureFixture[str], cli_env: None) -> None:
    assert main(["dockyard", "job", "list", "--kubeconfig", "/nonexistent"]) == 2
    err = capsys.readouterr().err
    assert (
        err.strip() == "nymph: error: which Ray head? pass --cluster NAME (a RayCluster) or --ray-address URL"
    )


def test_unreachable_cluster_is_one_line(
    capsys: pytest.CaptureFixture[str], cli_env: None, tmp_path: Any
) -> None:
    kubeconfig = tmp_path / "k.yaml"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {token: t}}]\n"
    )
    assert main(["dockyard", "cluster", "list", "--kubeconfig", str(kubeconfig), "-n", "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("nymph: error: list rayclusters.ray.io: ")
    assert "cannot reach the API server" in err and "\n" not in err


async def test_cluster_up_waits_900_seconds_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    from nymph.dockyard.live import run as live_run

    class PendingKube:
        async def get(self, *_a: Any, **_k: Any) -> dict[str, Any]:
            return {"status": {"state": "pending"}}

    now = iter([0.0, 0.0, 899.0, 901.0])

    class Time:  # the module's clock only: the event loop keeps the real one
        monotonic = staticmethod(lambda: next(now))

    monkeypatch.setattr(live_run, "time", Time)
    clock = live_run.Clock(lambda _line: None)
    with pytest.raises(DockyardLiveError, match="not ready after 900s"):
        await live_run.wait_cluster_ready(
            cast(Any, PendingKube()), name="c", namespace="ns", opts=live_run.LiveOptions(poll=0), clock=clock
        )
