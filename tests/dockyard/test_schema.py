"""The strict infra schema: unknown keys, types, enums, cross-field rules, partial blocks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nymph.dockyard.errors import DockyardConfigError
from nymph.dockyard.spec.enums import CodeSource, LaunchMode, SchedulerKind
from nymph.dockyard.spec.load import SHIPPED_DEFAULTS
from nymph.dockyard.spec.parse import parse_infra
from nymph.dockyard.spec.schema import InfraConfig, PDBSpec, SecuritySpec
from nymph.dockyard.spec.yamlio import load_file


def error(data: dict[str, Any]) -> DockyardConfigError:
    with pytest.raises(DockyardConfigError) as info:
        parse_infra(data)
    return info.value


def test_minimal_infra_parses(infra_dict: dict[str, Any]) -> None:
    infra = parse_infra(infra_dict)
    assert isinstance(infra, InfraConfig)
    assert infra.launch.mode is LaunchMode.RAYJOB
    assert infra.scheduler.kind is SchedulerKind.DEFAULT
    assert infra.sandbox is not None and infra.sandbox.replicas == 2


def test_shipped_defaults_agree_with_the_schema() -> None:
    body = load_file(SHIPPED_DEFAULTS)["infra"]
    launch = {"mode": "attach", "attach": "c"}
    must: dict[str, Any] = {"namespace": "ns", "image": "img", "launch": launch}
    from_yaml = parse_infra({**body, **must, "launch": {**body["launch"], **launch}})
    from_code = parse_infra(must)
    assert from_yaml == from_code


def test_unknown_top_level_key_lists_allowed_keys(infra_dict: dict[str, Any]) -> None:
    infra_dict["imagePullSecret"] = ["x"]
    err = error(infra_dict)
    assert err.path == "infra.imagePullSecret"
    assert "unknown key (allowed: annotations, checkpoints, dra, hf_cache, image, " in err.message
    assert "imagePullSecrets" in err.message


def test_unknown_nested_key_names_the_path(infra_dict: dict[str, Any]) -> None:
    infra_dict["sandbox"]["networkPolicy"] = {"allowEgres": False}
    err = error(infra_dict)
    assert err.path == "infra.sandbox.networkPolicy.allowEgres"
    assert err.message == "unknown key (allowed: allowEgress, allowedEgressCidrs, enabled, fromLabels)"


def test_unknown_key_in_a_list_item(infra_dict: dict[str, Any]) -> None:
    infra_dict["placement"] = {"tolerations": [{"key": "a"}, {"key": "b", "efect": "NoSchedule"}]}
    assert error(infra_dict).path == "infra.placement.tolerations[1].efect"


def test_enum_lists_allowed_values(infra_dict: dict[str, Any]) -> None:
    infra_dict["scheduler"] = {"kind": "slurm"}
    err = error(infra_dict)
    assert err.path == "infra.scheduler.kind"
    assert err.message == "string 'slurm' is not allowed (allowed: default, kai, kueue)"


def test_literal_lists_allowed_values(infra_dict: dict[str, Any]) -> None:
    infra_dict["sandbox"]["security"] = {"seccompProfile": "Localhost"}
    err = error(infra_dict)
    assert err.path == "infra.sandbox.security.seccompProfile"
    assert "(allowed: RuntimeDefault, Unconfined)" in err.message


@pytest.mark.parametrize(
    ("patch", "path", "fragment"),
    [
        ({"sandbox": {"replicas": "two"}}, "infra.sandbox.replicas", "expected an integer"),
        ({"sandbox": {"replicas": True}}, "infra.sandbox.replicas", "expected an integer"),
        ({"sandbox": {"injectUrls": "yes"}}, "infra.sandbox.injectUrls", "expected true or false"),
        ({"labels": {"flag": True}}, "infra.labels.flag", "quote it"),
        ({"rayVersion": 2.5}, "infra.rayVersion", "quote it"),
        ({"imagePullSecrets": "regcred"}, "infra.imagePullSecrets", "expected a list"),
        ({"placement": []}, "infra.placement", "expected a mapping"),
        ({"image": None}, "infra.image", "must not be null"),
        (
            {"sandbox": {"pdb": {"enabled": True, "maxUnavailable": 1.5}}},
            "infra.sandbox.pdb.maxUnavailable",
            "expected int or str",
        ),
    ],
)
def test_type_errors(infra_dict: dict[str, Any], patch: dict[str, Any], path: str, fragment: str) -> None:
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(infra_dict.get(key), dict):
            infra_dict[key].update(value)
        else:
            infra_dict[key] = value
    err = error(infra_dict)
    assert err.path == path
    assert fragment in err.message


def test_integers_become_strings_where_strings_are_expected(infra_dict: dict[str, Any]) -> None:
    infra_dict["labels"] = {"version": 2}
    infra_dict["sandbox"]["resources"] = {"cpu": 2, "memory": "4Gi", "cpuLimit": 0.5}
    infra = parse_infra(infra_dict)
    assert infra.labels == {"version": "2"}
    assert infra.sandbox is not None
    assert infra.sandbox.resources.cpu == "2"
    assert infra.sandbox.resources.cpuLimit == "0.5"


@pytest.mark.parametrize(
    ("patch", "path", "fragment"),
    [
        ({"scheduler": {"kind": "kai"}}, "infra.scheduler.queue", "required when kind is kai"),
        ({"scheduler": {"kind": "kueue"}}, "infra.scheduler.queue", "required when kind is kueue"),
        ({"launch": {"mode": "attach"}}, "infra.launch.attach", "required when mode is attach"),
        (
            {"launch": {"mode": "rayjob", "codeSource": "image"}},
            "infra.launch.codePath",
            "required when codeSource is image",
        ),
        ({"launch": {"mode": "rayjob"}}, "infra.launch.entrypoint", "required when launch.mode is rayjob"),
        ({"workspace": {"kind": "pvc"}}, "infra.workspace.pvcName", "required when kind is pvc"),
        ({"workspace": {"kind": "hostPath"}}, "infra.workspace.hostPath", "required"),
        ({"hf_cache": {"kind": "lustre"}}, "infra.hf_cache.pvcName", "required"),
        ({"checkpoints": {"kind": "pvc"}}, "infra.checkpoints.pvcName", "required"),
        ({"sandbox": {"resources": {"gpu": 1}}}, "infra.sandbox.resources.gpu", "GPU-free"),
        ({"sandbox": {"port": 70000}}, "infra.sandbox.port", "1-65535"),
        ({"sandbox": {"replicas": 0}}, "infra.sandbox.replicas", "at least 1"),
        ({"sandbox": {"name": "Bad_Name"}}, "infra.sandbox.name", "DNS-1035"),
        ({"namespace": "Team A"}, "infra.namespace", "not a DNS label"),
        (
            {"sandbox": {"networkPolicy": {"allowedEgressCidrs": ["10.0.0.0/8", "nope"]}}},
            "infra.sandbox.networkPolicy.allowedEgressCidrs[1]",
            "not a CIDR",
        ),
        (
            {"sandbox": {"pdb": {"enabled": True, "minAvailable": 1, "maxUnavailable": 1}}},
            "infra.sandbox.pdb",
            "exactly one of minAvailable / maxUnavailable",
        ),
        ({"resourceQuota": {"enabled": True}}, "infra.resourceQuota.hard", "required when enabled"),
        ({"limitRange": {"enabled": True}}, "infra.limitRange", "needs one of default"),
        (
            {"placement": {"tolerations": [{"operator": "Equal"}]}},
            "infra.placement.tolerations[0].key",
            "required when operator is Equal",
        ),
        ({"labels": {"owner": "has spaces"}}, "infra.labels.owner", "not a valid label value"),
    ],
)
def test_cross_field_rules(
    infra_dict: dict[str, Any], patch: dict[str, Any], path: str, fragment: str
) -> None:
    for key, value in patch.items():
        if key == "launch":
            infra_dict["launch"] = value
        elif isinstance(value, dict) and isinstance(infra_dict.get(key), dict):
            infra_dict[key].update(value)
        else:
            infra_dict[key] = value
    err = error(infra_dict)
    assert err.path == path
    assert fragment in err.message


def test_kuberay_required_outside_attach(infra_dict: dict[str, Any]) -> None:
    del infra_dict["kuberay"]
    err = error(infra_dict)
    assert err.path == "infra.kuberay"
    assert "required when launch.mode is rayjob" in err.message


def test_kuberay_needs_name_and_spec(infra_dict: dict[str, Any]) -> None:
    del infra_dict["kuberay"]["name"]
    assert error(infra_dict).path == "infra.kuberay.name"


def test_required_image() -> None:
    err = error({"namespace": "a", "launch": {"mode": "attach", "attach": "c"}})
    assert (err.path, err.message) == ("infra.image", "required")


def test_partial_sandbox_security_keeps_hardening_on(infra_dict: dict[str, Any]) -> None:
    infra_dict["sandbox"]["security"] = {"runAsNonRoot": True}
    infra = parse_infra(infra_dict)
    assert infra.sandbox is not None
    assert infra.sandbox.security == SecuritySpec(enabled=True, runAsNonRoot=True)


def test_partial_gpu_security_stays_opt_in(infra_dict: dict[str, Any]) -> None:
    infra_dict["security"] = {"runAsNonRoot": True}
    assert parse_infra(infra_dict).security.enabled is False


def test_a_sandbox_resources_block_replaces_the_default_as_a_whole(infra_dict: dict[str, Any]) -> None:
    # as dockyard-k8s does: no default ephemeral-storage request merged into a block without one
    infra_dict["sandbox"]["resources"] = {"cpu": "2"}
    infra = parse_infra(infra_dict)
    assert infra.sandbox is not None
    assert (
        infra.sandbox.resources.cpu,
        infra.sandbox.resources.memory,
        infra.sandbox.resources.ephemeralStorage,
    ) == ("2", None, None)


def test_without_a_resources_block_the_sandbox_default_applies(infra_dict: dict[str, Any]) -> None:
    infra_dict["sandbox"].pop("resources", None)
    infra = parse_infra(infra_dict)
    assert infra.sandbox is not None
    resources = infra.sandbox.resources
    assert (resources.cpu, resources.memory, resources.ephemeralStorage) == ("1", "2Gi", "10Gi")


def test_pdb_setting_one_bound_drops_the_default_of_the_other(infra_dict: dict[str, Any]) -> None:
    infra_dict["sandbox"]["pdb"] = {"minAvailable": 1}
    infra = parse_infra(infra_dict)
    assert infra.sandbox is not None
    assert infra.sandbox.pdb == PDBSpec(enabled=True, minAvailable=1, maxUnavailable=None)


def test_every_dockyard_k8s_field_is_accepted(infra_dict: dict[str, Any]) -> None:
    infra_dict.update(
        rayVersion="2.52.0",
        dra={"autoCreate": False, "roceCount": 4, "computeDomainNumNodes": 0},
        submit={
            "kind": "rayjob",
            "portForward": "kubectl-port-forward",
            "localDashboardPort": 18265,
            "submitter": "exec",
            "execTmpDir": "/tmp",
        },
        networking={
            "hostNetwork": False,
            "gloo_socket_ifname": "eth0",
            "nccl_socket_ifname": "eth0",
            "nccl_ib_disable": True,
            "nccl_net": "Socket",
            "extra_env": {"A": "b"},
        },
        workspace={"kind": "auto", "pvcName": "w", "mountPath": "/mnt", "repoSubdir": "r", "size": "1Ti"},
    )
    infra_dict["launch"].update(
        runMode="batch", rayUploadPaths=["a", "b"], codeSource="lustre", codePath="/mnt/code", env={"X": "1"}
    )
    infra_dict["kuberay"].update(
        labels={"a": "b"}, annotations={"c": "d"}, segmentSize=1, pdb={"enabled": False}
    )
    infra_dict["sandbox"].update(
        spec=None, annotations={"e": "f"}, healthCheckTimeoutS=60, injectUrls=False, labels={"g": "h"}
    )
    infra = parse_infra(infra_dict)
    assert infra.launch.codeSource is CodeSource.LUSTRE
    assert infra.launch.rayUploadPaths == ("a", "b")
    assert infra.dra.roceCount == 4


def test_error_names_the_source_file(tmp_path: Path, infra_dict: dict[str, Any]) -> None:
    infra_dict["bogus"] = 1
    with pytest.raises(DockyardConfigError) as info:
        parse_infra(infra_dict, origin=lambda path: f"file-for-{'.'.join(map(str, path))}")
    assert info.value.source == "file-for-bogus"
    assert str(info.value).startswith("file-for-bogus: infra.bogus: unknown key")
