"""Rendering rules: order, fleets, injected env, cross-cutting fields, hardening toggles."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from nymph.dockyard.errors import DockyardConfigError
from nymph.dockyard.render.k8s import COMPAT_MANAGED_BY_KEY, MANAGED_BY, MANAGED_BY_KEY, Manifest
from nymph.dockyard.render.manifests import render_manifests, to_yaml
from nymph.dockyard.spec.parse import parse_infra

URL = "http://sbx.team-a.svc.cluster.local:9090"


def render(data: dict[str, Any]) -> list[Manifest]:
    return render_manifests(infra=parse_infra(data))


def kinds(manifests: list[Manifest]) -> list[str]:
    return [f"{m['kind']}/{m['metadata']['name']}" for m in manifests]


def one(manifests: list[Manifest], kind: str) -> Manifest:
    found = [m for m in manifests if m["kind"] == kind]
    assert len(found) == 1, kinds(manifests)
    return found[0]


def ray_spec(manifests: list[Manifest]) -> dict[str, Any]:
    for m in manifests:
        if m["kind"] == "RayJob":
            spec: dict[str, Any] = m["spec"]["rayClusterSpec"]
            return spec
        if m["kind"] == "RayCluster":
            return m["spec"]
    raise AssertionError(kinds(manifests))


def gpu_pods(manifests: list[Manifest]) -> list[dict[str, Any]]:
    spec = ray_spec(manifests)
    return [g["template"]["spec"] for g in [spec["headGroupSpec"], *spec["workerGroupSpecs"]]]


def sandbox_pod(manifests: list[Manifest]) -> dict[str, Any]:
    pod: dict[str, Any] = one(manifests, "Deployment")["spec"]["template"]["spec"]
    return pod


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def group(manifests: list[Manifest], name: str) -> dict[str, Any]:
    groups = ray_spec(manifests)["workerGroupSpecs"]
    found: dict[str, Any] = next(g for g in groups if g["groupName"] == name)
    return found


def all_pod_templates(manifests: list[Manifest]) -> list[dict[str, Any]]:
    spec = ray_spec(manifests)
    return [
        one(manifests, "Deployment")["spec"]["template"],
        spec["headGroupSpec"]["template"],
        *(g["template"] for g in spec["workerGroupSpecs"]),
    ]


# -- order --------------------------------------------------------------------------------


def test_rayjob_mode_order(infra_dict: dict[str, Any]) -> None:
    assert kinds(render(infra_dict)) == [
        "Deployment/sbx",
        "Service/sbx",
        "NetworkPolicy/sbx-netpol",
        "PodDisruptionBudget/sbx-pdb",
        "RayJob/grpo",
    ]


def test_bringup_mode_renders_a_raycluster(infra_dict: dict[str, Any]) -> None:
    infra_dict["launch"]["mode"] = "bringup"
    assert kinds(render(infra_dict))[-1] == "RayCluster/grpo"


def test_attach_mode_renders_only_the_sandbox_pool(infra_dict: dict[str, Any]) -> None:
    infra_dict["launch"] = {"mode": "attach", "attach": "existing"}
    del infra_dict["kuberay"]
    assert kinds(render(infra_dict)) == [
        "Deployment/sbx",
        "Service/sbx",
        "NetworkPolicy/sbx-netpol",
        "PodDisruptionBudget/sbx-pdb",
    ]


def test_governance_first_and_only_when_enabled(infra_dict: dict[str, Any]) -> None:
    assert not {"ResourceQuota", "LimitRange"} & {m["kind"] for m in render(infra_dict)}
    infra_dict["resourceQuota"] = {"enabled": True, "hard": {"requests.nvidia.com/gpu": 32}}
    infra_dict["limitRange"] = {"enabled": True, "max": {"memory": "1Ti"}}
    out = render(infra_dict)
    assert kinds(out)[:2] == ["ResourceQuota/dockyard-quota", "LimitRange/dockyard-limits"]
    assert out[0]["spec"] == {"hard": {"requests.nvidia.com/gpu": "32"}}
    assert out[1]["spec"] == {"limits": [{"type": "Container", "max": {"memory": "1Ti"}}]}


def test_no_sandbox_means_no_pool_and_no_url(infra_dict: dict[str, Any]) -> None:
    del infra_dict["sandbox"]
    out = render(infra_dict)
    assert kinds(out) == ["RayJob/grpo"]
    for pod in gpu_pods(out):
        assert "DOCKYARD_SANDBOX_URLS" not in env_of(pod["containers"][0])


# -- fleets -------------------------------------------------------------------------------


def test_worker_groups_are_tagged_with_their_fleet(infra_dict: dict[str, Any]) -> None:
    out = render(infra_dict)
    for role in ("trainer", "inference"):
        g = group(out, role)
        raw = g["rayStartParams"]["resources"]
        assert raw.startswith("'") and raw.endswith("'")
        assert json.loads(raw[1:-1]) == {f"dockyard_fleet_{role}": 1}
        for c in g["template"]["spec"]["containers"]:
            assert env_of(c)["DOCKYARD_FLEET_ROLE"] == role
    head = ray_spec(out)["headGroupSpec"]
    assert "DOCKYARD_FLEET_ROLE" not in env_of(head["template"]["spec"]["containers"][0])


@pytest.mark.parametrize(
    "authored",
    [
        '{"worker_units": 8}',
        "'{\"worker_units\": 8}'",
        '"{\\"worker_units\\": 8}"',
    ],
)
def test_authored_ray_resources_are_kept_and_tagged(infra_dict: dict[str, Any], authored: str) -> None:
    infra_dict["kuberay"]["spec"]["workerGroupSpecs"][0]["rayStartParams"]["resources"] = authored
    raw = group(render(infra_dict), "trainer")["rayStartParams"]["resources"]
    assert raw == '\'{"worker_units": 8, "dockyard_fleet_trainer": 1}\''


def test_role_from_env_when_the_group_name_says_nothing(infra_dict: dict[str, Any]) -> None:
    g = infra_dict["kuberay"]["spec"]["workerGroupSpecs"][1]
    g["groupName"] = "rollout"
    g["template"]["spec"]["containers"][0]["env"] = [{"name": "DOCKYARD_FLEET_ROLE", "value": "inference"}]
    raw = group(render(infra_dict), "rollout")["rayStartParams"]["resources"]
    assert "dockyard_fleet_inference" in raw


def test_conflicting_roles_are_an_error(infra_dict: dict[str, Any]) -> None:
    g = infra_dict["kuberay"]["spec"]["workerGroupSpecs"][0]
    g["template"]["spec"]["containers"][0]["env"] = [{"name": "DOCKYARD_FLEET_ROLE", "value": "trainer"}]
    g["rayStartParams"]["resources"] = '{"dockyard_fleet_inference": 1}'
    with pytest.raises(DockyardConfigError) as info:
        render(infra_dict)
    assert info.value.path == "infra.kuberay.spec.workerGroupSpecs[0]"
    assert "conflicting fleet roles" in str(info.value)


def test_unknown_group_role_is_an_error(infra_dict: dict[str, Any]) -> None:
    infra_dict["kuberay"]["spec"]["workerGroupSpecs"][1]["groupName"] = "extra"
    with pytest.raises(DockyardConfigError, match="cannot tell the fleet role of worker group 'extra'"):
        render(infra_dict)


def test_both_fleets_are_required(infra_dict: dict[str, Any]) -> None:
    infra_dict["kuberay"]["spec"]["workerGroupSpecs"][1]["groupName"] = "trainer-b"
    with pytest.raises(DockyardConfigError, match="no inference worker group") as info:
        render(infra_dict)
    assert info.value.path == "infra.kuberay.spec.workerGroupSpecs"


def test_segments_split_large_groups(infra_dict: dict[str, Any]) -> None:
    infra_dict["kuberay"]["segmentSize"] = 2
    infra_dict["kuberay"]["spec"]["workerGroupSpecs"][0]["replicas"] = 4
    names = [g["groupName"] for g in ray_spec(render(infra_dict))["workerGroupSpecs"]]
    assert names == ["trainer-segment-0", "trainer-segment-1", "inference"]
    seg = group(render(infra_dict), "trainer-segment-1")
    assert (seg["replicas"], seg["minReplicas"], seg["maxReplicas"]) == (2, 2, 2)
    assert "dockyard_fleet_trainer" in seg["rayStartParams"]["resources"]


def test_segment_size_must_divide_replicas(infra_dict: dict[str, Any]) -> None:
    infra_dict["kuberay"]["segmentSize"] = 3
    infra_dict["kuberay"]["spec"]["workerGroupSpecs"][0]["replicas"] = 4
    with pytest.raises(DockyardConfigError, match="not a multiple of kuberay.segmentSize 3"):
        render(infra_dict)


def test_gang_replicas_and_string_params(infra_dict: dict[str, Any]) -> None:
    g = infra_dict["kuberay"]["spec"]["workerGroupSpecs"][0]
    g["rayStartParams"] = {"num-gpus": 8, "block": True}
    out = group(render(infra_dict), "trainer")
    assert (out["minReplicas"], out["maxReplicas"]) == (2, 2)
    assert out["rayStartParams"]["num-gpus"] == "8"
    assert out["rayStartParams"]["block"] == "true"


def test_worker_group_needs_a_size(infra_dict: dict[str, Any]) -> None:
    del infra_dict["kuberay"]["spec"]["workerGroupSpecs"][0]["replicas"]
    with pytest.raises(DockyardConfigError) as info:
        render(infra_dict)
    assert info.value.path == "infra.kuberay.spec.workerGroupSpecs[0].replicas"


def test_worker_group_needs_containers(infra_dict: dict[str, Any]) -> None:
    infra_dict["kuberay"]["spec"]["workerGroupSpecs"][1]["template"] = {"spec": {}}
    with pytest.raises(DockyardConfigError, match="template.spec.containers") as info:
        render(infra_dict)
    assert info.value.path == "infra.kuberay.spec.workerGroupSpecs[1]"


# -- injected env and cross-cutting fields --------------------------------------------------


def test_every_gpu_container_gets_the_injected_env(infra_dict: dict[str, Any]) -> None:
    for pod in gpu_pods(render(infra_dict)):
        for c in pod["containers"]:
            env = env_of(c)
            assert env["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] == "0"
            assert env["DOCKYARD_SANDBOX_URLS"] == URL


def test_inject_urls_off(infra_dict: dict[str, Any]) -> None:
    infra_dict["sandbox"]["injectUrls"] = False
    for pod in gpu_pods(render(infra_dict)):
        env = env_of(pod["containers"][0])
        assert "DOCKYARD_SANDBOX_URLS" not in env
        assert env["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] == "0"


def test_sandbox_url_follows_name_namespace_and_port(infra_dict: dict[str, Any]) -> None:
    infra_dict["sandbox"].update(name="pool", port=8080)
    infra_dict["namespace"] = "rl"
    env = env_of(gpu_pods(render(infra_dict))[1]["containers"][0])
    assert env["DOCKYARD_SANDBOX_URLS"] == "http://pool.rl.svc.cluster.local:8080"


def test_authored_env_wins(infra_dict: dict[str, Any]) -> None:
    head = infra_dict["kuberay"]["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    head["env"] = [{"name": "DOCKYARD_SANDBOX_URLS", "value": "http://elsewhere:1"}]
    env = env_of(gpu_pods(render(infra_dict))[0]["containers"][0])
    assert env["DOCKYARD_SANDBOX_URLS"] == "http://elsewhere:1"


def test_image_pull_secrets_and_service_account(infra_dict: dict[str, Any]) -> None:
    infra_dict.update(imagePullSecrets=["regcred"], serviceAccount="dockyard-rl")
    infra_dict["kuberay"]["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"].append(
        {"name": "log-shipper", "image": "fluent/fluent-bit:3"}
    )
    out = render(infra_dict)
    for pod in [*gpu_pods(out), sandbox_pod(out)]:
        assert pod["containers"][0]["image"] == "dockyard/ubuntu-swe:1"
        assert pod["imagePullSecrets"] == [{"name": "regcred"}]
        assert pod["serviceAccountName"] == "dockyard-rl"
    trainer = group(out, "trainer")["template"]["spec"]
    assert trainer["containers"][1]["image"] == "fluent/fluent-bit:3"


def test_priority_class_on_every_managed_pod(infra_dict: dict[str, Any]) -> None:
    infra_dict["priorityClassName"] = "dockyard-high"
    infra_dict["kuberay"]["spec"]["workerGroupSpecs"][1]["template"]["spec"]["priorityClassName"] = (
        "dockyard-low"
    )
    out = render(infra_dict)
    pods = [t["spec"] for t in all_pod_templates(out)]
    assert [p["priorityClassName"] for p in pods] == [
        "dockyard-high",
        "dockyard-high",
        "dockyard-high",
        "dockyard-low",
    ]


def test_no_priority_class_unless_set(infra_dict: dict[str, Any]) -> None:
    pods = [t["spec"] for t in all_pod_templates(render(infra_dict))]
    assert all("priorityClassName" not in p for p in pods)


def test_managed_by_label_and_infra_labels_everywhere(infra_dict: dict[str, Any]) -> None:
    infra_dict["labels"] = {"team": "rl", MANAGED_BY_KEY: "someone-else"}
    infra_dict["annotations"] = {"note": "x"}
    out = render(infra_dict)
    for m in out:
        assert m["metadata"]["labels"][MANAGED_BY_KEY] == MANAGED_BY
        assert m["metadata"]["labels"]["team"] == "rl"
    for template in all_pod_templates(out):
        assert template["metadata"]["labels"][MANAGED_BY_KEY] == MANAGED_BY
        assert template["metadata"]["labels"]["team"] == "rl"
    assert one(out, "Deployment")["metadata"]["annotations"] == {"note": "x"}
    assert one(out, "RayJob")["metadata"]["annotations"] == {"note": "x"}


def test_objects_carry_dockyard_k8s_managed_by_next_to_nymphs_own_marker(infra_dict: dict[str, Any]) -> None:
    infra_dict["labels"] = {COMPAT_MANAGED_BY_KEY: "someone-else"}
    out = render(infra_dict)
    assert MANAGED_BY_KEY != COMPAT_MANAGED_BY_KEY
    for labels in [m["metadata"]["labels"] for m in out] + [
        t["metadata"]["labels"] for t in all_pod_templates(out)
    ]:
        assert labels[COMPAT_MANAGED_BY_KEY] == "dockyard-k8s"
        assert labels[MANAGED_BY_KEY] == MANAGED_BY


def test_rayjob_spec(infra_dict: dict[str, Any]) -> None:
    infra_dict["launch"]["env"] = {"WANDB_MODE": "offline"}
    job = one(render(infra_dict), "RayJob")
    spec = job["spec"]
    assert spec["entrypoint"] == "python3 -u train.py"
    assert spec["submissionMode"] == "HTTPMode"
    assert spec["shutdownAfterJobFinishes"] is True
    assert yaml.safe_load(spec["runtimeEnvYAML"]) == {"env_vars": {"WANDB_MODE": "offline"}}


def test_ray_version_fills_in_but_does_not_override(infra_dict: dict[str, Any]) -> None:
    infra_dict["rayVersion"] = "2.52.0"
    assert ray_spec(render(infra_dict))["rayVersion"] == "2.52.0"
    infra_dict["kuberay"]["spec"]["rayVersion"] = "2.40.0"
    assert ray_spec(render(infra_dict))["rayVersion"] == "2.40.0"


def test_kai_scheduler(infra_dict: dict[str, Any]) -> None:
    infra_dict["scheduler"] = {"kind": "kai", "queue": "rl"}
    out = render(infra_dict)
    assert one(out, "RayJob")["metadata"]["labels"]["kai.scheduler/queue"] == "rl"
    for pod in gpu_pods(out):
        assert pod["schedulerName"] == "kai-scheduler"
    assert "schedulerName" not in sandbox_pod(out)


def test_kueue_scheduler(infra_dict: dict[str, Any]) -> None:
    infra_dict["scheduler"] = {"kind": "kueue", "queue": "gpu"}
    out = render(infra_dict)
    assert one(out, "RayJob")["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu"
    assert all("schedulerName" not in pod for pod in gpu_pods(out))


def test_placement_applies_to_gpu_pods_only(infra_dict: dict[str, Any]) -> None:
    infra_dict["placement"] = {
        "nodeSelector": {"gpu": "h100"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
    }
    infra_dict["kuberay"]["spec"]["workerGroupSpecs"][0]["template"]["spec"]["nodeSelector"] = {"gpu": "b200"}
    out = render(infra_dict)
    head, trainer, inference = gpu_pods(out)
    assert head["nodeSelector"] == {"gpu": "h100"}
    assert trainer["nodeSelector"] == {"gpu": "b200"}
    assert inference["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert "nodeSelector" not in sandbox_pod(out)


def test_networking_and_storage(infra_dict: dict[str, Any]) -> None:
    infra_dict["networking"] = {
        "hostNetwork": True,
        "nccl_socket_ifname": "eth0",
        "nccl_ib_disable": True,
        "extra_env": {"NCCL_DEBUG": "WARN"},
    }
    infra_dict["hf_cache"] = {"kind": "pvc", "pvcName": "hf"}
    infra_dict["checkpoints"] = {"kind": "lustre", "pvcName": "ckpt"}
    for pod in gpu_pods(render(infra_dict)):
        env = env_of(pod["containers"][0])
        assert env["NCCL_SOCKET_IFNAME"] == "eth0"
        assert env["NCCL_IB_DISABLE"] == "1"
        assert env["NCCL_DEBUG"] == "WARN"
        assert env["HF_HOME"] == "/root/.cache/huggingface"
        assert pod["hostNetwork"] is True
        assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
        claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]}
        assert claims == {"hf-cache": "hf", "checkpoints": "ckpt"}
        mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
        assert mounts == {"/root/.cache/huggingface", "/mnt/dockyard/checkpoints"}


# -- sandbox hardening (on by default) -------------------------------------------------------


def test_sandbox_hardening_defaults(infra_dict: dict[str, Any]) -> None:
    pod = sandbox_pod(render(infra_dict))
    sc = pod["containers"][0]["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert pod["automountServiceAccountToken"] is False
    assert "runAsNonRoot" not in sc and "runAsNonRoot" not in pod["securityContext"]


def test_run_as_non_root_is_opt_in(infra_dict: dict[str, Any]) -> None:
    infra_dict["sandbox"]["security"] = {"runAsNonRoot": True, "runAsUser": 1000}
    pod = sandbox_pod(render(infra_dict))
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 1000
    assert pod["containers"][0]["securityContext"]["runAsNonRoot"] is True
    assert pod["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_sandbox_security_disabled_drops_contexts(infra_dict: dict[str, Any]) -> None:
    infra_dict["sandbox"]["security"] = {"enabled": False}
    pod = sandbox_pod(render(infra_dict))
    assert "securityContext" not in pod
    assert "securityContext" not in pod["containers"][0]
    assert "automountServiceAccountToken" not in pod


def test_network_policy_default(infra_dict: dict[str, Any]) -> None:
    np = one(render(infra_dict), "NetworkPolicy")["spec"]
    assert np["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "sbx"}}
    assert np["policyTypes"] == ["Ingress", "Egress"]
    assert np["ingress"] == [{"from": [{"podSelector": {}}], "ports": [{"protocol": "TCP", "port": 9090}]}]
    dns = {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}
    assert np["egress"] == [dns, {}]


def test_network_policy_locked_egress_with_cidrs(infra_dict: dict[str, Any]) -> None:
    infra_dict["sandbox"]["networkPolicy"] = {
        "allowEgress": False,
        "allowedEgressCidrs": ["10.0.0.0/8", "192.168.1.0/24"],
    }
    egress = one(render(infra_dict), "NetworkPolicy")["spec"]["egress"]
    assert egress == [
        {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
        {"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}, {"ipBlock": {"cidr": "192.168.1.0/24"}}]},
    ]
    assert {} not in egress


def test_network_policy_locked_egress_without_cidrs_is_dns_only(infra_dict: dict[str, Any]) -> None:
    infra_dict["sandbox"]["networkPolicy"] = {"allowEgress": False}
    egress = one(render(infra_dict), "NetworkPolicy")["spec"]["egress"]
    assert egress == [{"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}]


def test_network_policy_from_labels(infra_dict: dict[str, Any]) -> None:
    infra_dict["sandbox"]["networkPolicy"] = {"fromLabels": {"ray.io/cluster": "grpo"}}
    ingress = one(render(infra_dict), "NetworkPolicy")["spec"]["ingress"]
    assert ingress[0]["from"] == [{"podSelector": {"matchLabels": {"ray.io/cluster": "grpo"}}}]


def test_network_policy_disabled(infra_dict: dict[str, Any]) -> None:
    infra_dict["sandbox"]["networkPolicy"] = {"enabled": False}
    assert "NetworkPolicy" not in {m["kind"] for m in render(infra_dict)}


def test_sandbox_pdb_default_and_disabled(infra_dict: dict[str, Any]) -> None:
    pdb = one(render(infra_dict), "PodDisruptionBudget")
    assert pdb["spec"] == {
        "selector": {"matchLabels": {"app.kubernetes.io/name": "sbx"}},
        "maxUnavailable": 1,
    }
    infra_dict["sandbox"]["pdb"] = {"enabled": False}
    assert "PodDisruptionBudget" not in {m["kind"] for m in render(infra_dict)}


def test_sandbox_pdb_min_available(infra_dict: dict[str, Any]) -> None:
    infra_dict["sandbox"]["pdb"] = {"minAvailable": "50%"}
    pdb = one(render(infra_dict), "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == "50%"
    assert "maxUnavailable" not in pdb["spec"]


def test_sandbox_requests_small_with_limits_defaulting_to_requests(infra_dict: dict[str, Any]) -> None:
    res = sandbox_pod(render(infra_dict))["containers"][0]["resources"]
    assert res["requests"] == {"cpu": "1", "memory": "2Gi", "ephemeral-storage": "10Gi"}
    assert res["limits"] == res["requests"]


def test_sandbox_explicit_limits(infra_dict: dict[str, Any]) -> None:
    # the block replaces the default as a whole: no memory / ephemeral-storage request added
    infra_dict["sandbox"]["resources"] = {"cpu": "500m", "cpuLimit": "4", "ephemeralStorageLimit": "20Gi"}
    res = sandbox_pod(render(infra_dict))["containers"][0]["resources"]
    assert res["requests"] == {"cpu": "500m"}
    assert res["limits"] == {"cpu": "4", "ephemeral-storage": "20Gi"}


def test_sandbox_container(infra_dict: dict[str, Any]) -> None:
    infra_dict["sandbox"]["env"] = {"WORKERS": 4}
    c = sandbox_pod(render(infra_dict))["containers"][0]
    assert env_of(c) == {"DOCKYARD_FLEET_ROLE": "sandbox", "API_PORT": "9090", "WORKERS": "4"}
    assert c["readinessProbe"]["tcpSocket"] == {"port": 9090}
    assert c["ports"] == [{"name": "http", "containerPort": 9090, "protocol": "TCP"}]
    assert "nvidia.com/gpu" not in c["resources"]["limits"]


def test_topology_spread_on_the_pool(infra_dict: dict[str, Any]) -> None:
    tsc = [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "sbx"}},
        }
    ]
    infra_dict["sandbox"]["topologySpreadConstraints"] = tsc
    assert sandbox_pod(render(infra_dict))["topologySpreadConstraints"] == tsc


def test_service(infra_dict: dict[str, Any]) -> None:
    svc = one(render(infra_dict), "Service")
    assert svc["spec"] == {
        "type": "ClusterIP",
        "selector": {"app.kubernetes.io/name": "sbx"},
        "ports": [{"name": "http", "port": 9090, "targetPort": 9090, "protocol": "TCP"}],
    }


def test_inline_sandbox_spec_is_kept_and_filled_in(infra_dict: dict[str, Any]) -> None:
    infra_dict["priorityClassName"] = "high"
    infra_dict["sandbox"]["spec"] = {
        "template": {
            "spec": {
                "containers": [
                    {"name": "exec", "image": "custom:1", "securityContext": {"privileged": False}}
                ]
            }
        }
    }
    dep = one(render(infra_dict), "Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["selector"] == {"matchLabels": {"app.kubernetes.io/name": "sbx"}}
    assert pod["containers"][0]["image"] == "custom:1"
    assert pod["containers"][0]["securityContext"] == {"privileged": False}
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert pod["priorityClassName"] == "high"
    assert env_of(pod["containers"][0])["DOCKYARD_FLEET_ROLE"] == "sandbox"
    assert dep["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] == "sbx"


# -- GPU hardening (off by default) -----------------------------------------------------------


def test_gpu_hardening_off_by_default(infra_dict: dict[str, Any]) -> None:
    for pod in gpu_pods(render(infra_dict)):
        assert "securityContext" not in pod
        assert all("securityContext" not in c for c in pod["containers"])


def test_gpu_hardening_enabled(infra_dict: dict[str, Any]) -> None:
    infra_dict["security"] = {"enabled": True, "runAsNonRoot": True}
    for pod in gpu_pods(render(infra_dict)):
        assert pod["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
        sc = pod["containers"][0]["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}


def test_gpu_authored_security_context_wins(infra_dict: dict[str, Any]) -> None:
    infra_dict["security"] = {"enabled": True}
    worker = infra_dict["kuberay"]["spec"]["workerGroupSpecs"][0]["template"]["spec"]
    worker["containers"][0]["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    trainer = group(render(infra_dict), "trainer")["template"]["spec"]
    assert trainer["containers"][0]["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}


def test_gpu_pdb_only_in_bringup(infra_dict: dict[str, Any]) -> None:
    infra_dict["kuberay"]["pdb"] = {"enabled": True, "minAvailable": 3}
    assert [m for m in render(infra_dict) if m["kind"] == "PodDisruptionBudget"][-1]["metadata"][
        "name"
    ] == "sbx-pdb"
    infra_dict["launch"]["mode"] = "bringup"
    out = render(infra_dict)
    pdb = [m for m in out if m["kind"] == "PodDisruptionBudget"][-1]
    assert pdb["metadata"]["name"] == "grpo-pdb"
    assert pdb["spec"] == {"selector": {"matchLabels": {"ray.io/cluster": "grpo"}}, "minAvailable": 3}
    assert kinds(out).index("PodDisruptionBudget/grpo-pdb") < kinds(out).index("RayCluster/grpo")


def test_gpu_pdb_disabled_by_default(infra_dict: dict[str, Any]) -> None:
    infra_dict["launch"]["mode"] = "bringup"
    assert "PodDisruptionBudget/grpo-pdb" not in kinds(render(infra_dict))


# -- determinism, purity, validity ------------------------------------------------------------


def test_byte_identical_output(infra_dict: dict[str, Any]) -> None:
    first = to_yaml(render(copy.deepcopy(infra_dict)))
    second = to_yaml(render(copy.deepcopy(infra_dict)))
    assert first == second
    assert "&id" not in first and "*id" not in first


def test_render_does_not_mutate_the_infra(infra_dict: dict[str, Any]) -> None:
    infra = parse_infra(infra_dict)
    before = copy.deepcopy(infra.kuberay.spec)  # type: ignore[union-attr]
    render_manifests(infra=infra)
    render_manifests(infra=infra)
    assert infra.kuberay.spec == before  # type: ignore[union-attr]


def test_duplicate_object_names_are_an_error(infra_dict: dict[str, Any]) -> None:
    infra_dict["launch"]["mode"] = "bringup"
    infra_dict["kuberay"]["name"] = "sbx"
    infra_dict["kuberay"]["pdb"] = {"enabled": True, "maxUnavailable": 0}
    with pytest.raises(DockyardConfigError, match="two PodDisruptionBudget objects named 'sbx-pdb'"):
        render(infra_dict)


VARIANTS: list[dict[str, Any]] = [
    {},
    {"launch": {"mode": "bringup"}, "kuberay": {"pdb": {"enabled": True, "maxUnavailable": 0}}},
    {
        "security": {
            "enabled": True,
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "fsGroup": 1000,
            "readOnlyRootFilesystem": True,
        }
    },
    {
        "sandbox": {
            "networkPolicy": {"allowEgress": False, "allowedEgressCidrs": ["10.0.0.0/8"]},
            "security": {"runAsNonRoot": True},
            "pdb": {"minAvailable": "50%"},
        }
    },
    {
        "scheduler": {"kind": "kai", "queue": "rl"},
        "priorityClassName": "p",
        "placement": {
            "nodeSelector": {"a": "b"},
            "tolerations": [{"key": "k", "value": "v"}],
            "affinity": {"nodeAffinity": {}},
        },
        "networking": {"hostNetwork": True, "nccl_net": "IB", "gloo_socket_ifname": "eth0"},
        "workspace": {"kind": "hostPath", "hostPath": "/data"},
        "hf_cache": {"kind": "emptyDir"},
        "checkpoints": {"kind": "pvc", "pvcName": "c"},
        "imagePullSecrets": ["a", "b"],
        "serviceAccount": "sa",
        "labels": {"x": "y"},
        "annotations": {"z": "w"},
    },
    {
        "resourceQuota": {"enabled": True, "hard": {"pods": 10}},
        "limitRange": {
            "enabled": True,
            "default": {"cpu": 1},
            "defaultRequest": {"cpu": "500m"},
            "max": {"cpu": 8},
            "min": {"cpu": "100m"},
        },
    },
    {"launch": {"env": {"A": "1"}}, "kuberay": {"segmentSize": 1}},
]


def _deep_update(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _deep_update(base[k], v)
        else:
            base[k] = v
    return base


@pytest.mark.parametrize("variant", VARIANTS, ids=[str(i) for i in range(len(VARIANTS))])
def test_every_manifest_validates_strictly(
    infra_dict: dict[str, Any], variant: dict[str, Any], validate: Callable[[Manifest], None]
) -> None:
    out = render(_deep_update(infra_dict, copy.deepcopy(variant)))
    assert out
    for manifest in out:
        validate(manifest)
