"""The Pod policy: what a pod spec rendered from user input may not ask for, found wherever it
hides (containers, init and ephemeral containers, pod templates of every kind, KubeRay's
autoscaler), and the daemon's workdir as the one hostPath allowed."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nymph.errors import ValidationError
from nymph.launch.podpolicy import (
    BASELINE_CAPABILITIES,
    SAFE_SYSCTLS,
    PodPolicyError,
    check_manifests,
    check_pod_spec,
    pod_templates,
)
from nymph.launch.render import render_pod
from nymph.launch.spec import LaunchSpec

ROOT = "/var/lib/nymph"
IID = "lakeshore-0123abcd"


def workdir_volume(path: str = f"{ROOT}/work/{IID}", kind: str | None = "Directory") -> dict[str, Any]:
    host: dict[str, Any] = {"path": path}
    if kind is not None:
        host["type"] = kind
    return {"name": "workdir", "hostPath": host}


def pod(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"containers": [{"name": "user", "image": "python:3.12"}]}
    base.update(spec)
    return base


def refused(spec: dict[str, Any], *, workdir_root: str | None = None, where: str = "Pod/x spec") -> str:
    with pytest.raises(PodPolicyError) as info:
        check_pod_spec(spec, where=where, workdir_root=workdir_root)
    assert isinstance(info.value, ValidationError)
    assert info.value.field.startswith(where)
    return str(info.value)


def test_a_plain_pod_passes() -> None:
    check_pod_spec(pod(), where="Pod/x spec")
    check_pod_spec(
        pod(
            hostNetwork=False,
            securityContext={"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            volumes=[{"name": "tmp", "emptyDir": {}}],
        ),
        where="Pod/x spec",
    )


def test_the_rendered_daemon_pod_passes_with_its_workdir_root() -> None:
    spec = LaunchSpec(
        instance_id=IID,
        owner_namespace="default",
        namespace="jobs",
        provider="kind",
        image="python:3.12",
        script="print(1)",
    )
    manifest = render_pod(spec, node="n1", workdir_root=ROOT)
    check_pod_spec(manifest["spec"], where="Pod/x spec", workdir_root=ROOT)
    check_pod_spec(manifest["spec"], where="Pod/x spec", workdir_root=ROOT + "/")
    # without a workdir root, the same hostPath is refused
    assert "hostPath volumes are not allowed" in refused(manifest["spec"])


@pytest.mark.parametrize(
    ("spec", "field", "needle"),
    [
        (pod(hostNetwork=True), "spec.hostNetwork", "host's namespaces"),
        (pod(hostPID=True), "spec.hostPID", "host's namespaces"),
        (pod(hostIPC=True), "spec.hostIPC", "host's namespaces"),
        (pod(hostIPC="yes"), "spec.hostIPC", "host's namespaces"),
        (
            pod(containers=[{"name": "c", "securityContext": {"privileged": True}}]),
            "spec.containers[0].securityContext.privileged",
            "privileged containers are not allowed",
        ),
        (
            pod(initContainers=[{"name": "i", "securityContext": {"privileged": True}}]),
            "spec.initContainers[0].securityContext.privileged",
            "privileged",
        ),
        (
            pod(ephemeralContainers=[{"name": "e", "securityContext": {"privileged": True}}]),
            "spec.ephemeralContainers[0].securityContext.privileged",
            "privileged",
        ),
        (
            pod(containers=[{"name": "c", "ports": [{"containerPort": 80, "hostPort": 80}]}]),
            "spec.containers[0].ports[0].hostPort",
            "host ports",
        ),
        (
            pod(containers=[{"name": "c", "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}]),
            "spec.containers[0].securityContext.capabilities.add[0]",
            "'SYS_ADMIN' is not allowed",
        ),
        (
            pod(containers=[{"name": "c", "securityContext": {"capabilities": {"add": ["CAP_CHOWN"]}}}]),
            "spec.containers[0].securityContext.capabilities.add[0]",
            "not allowed",
        ),
        (pod(volumes=[{"name": "root", "hostPath": {"path": "/"}}]), "spec.volumes[0].hostPath", "hostPath"),
        (
            pod(containers=[{"name": "c", "securityContext": {"procMount": "Unmasked"}}]),
            "spec.containers[0].securityContext.procMount",
            "Default",
        ),
        (
            pod(securityContext={"seccompProfile": {"type": "Unconfined"}}),
            "spec.securityContext.seccompProfile.type",
            "Unconfined",
        ),
        (
            pod(containers=[{"name": "c", "securityContext": {"seccompProfile": {"type": "Unconfined"}}}]),
            "spec.containers[0].securityContext.seccompProfile.type",
            "Unconfined",
        ),
        (
            pod(containers=[{"name": "c", "securityContext": {"appArmorProfile": {"type": "Unconfined"}}}]),
            "spec.containers[0].securityContext.appArmorProfile.type",
            "Unconfined",
        ),
        (
            pod(securityContext={"windowsOptions": {"hostProcess": True}}),
            "spec.securityContext.windowsOptions.hostProcess",
            "host process",
        ),
        (
            pod(securityContext={"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}),
            "spec.securityContext.sysctls[0].name",
            "kernel.msgmax",
        ),
        (
            pod(securityContext={"seLinuxOptions": {"type": "spc_t"}}),
            "spec.securityContext.seLinuxOptions.type",
            "SELinux types",
        ),
        (
            pod(containers=[{"name": "c", "securityContext": {"seLinuxOptions": {"user": "root"}}}]),
            "spec.containers[0].securityContext.seLinuxOptions.user",
            "SELinux user or role",
        ),
        (pod(containers={"name": "c"}), "spec.containers", "expected a list"),
        (pod(volumes=[{"name": "v", "hostPath": "/etc"}]), "spec.volumes[0].hostPath", "expected a mapping"),
        (
            pod(containers=[{"name": "c", "securityContext": {"capabilities": {"add": "SYS_ADMIN"}}}]),
            "spec.containers[0].securityContext.capabilities.add",
            "expected a list",
        ),
    ],
)
def test_each_baseline_violation_is_refused_naming_its_field(
    spec: dict[str, Any], field: str, needle: str
) -> None:
    message = refused(spec, workdir_root=ROOT)
    assert message.startswith(f"Pod/x {field}: "), message
    assert needle in message


def test_baseline_allows_what_it_allows() -> None:
    check_pod_spec(
        pod(
            containers=[
                {
                    "name": "c",
                    "ports": [{"containerPort": 80, "hostPort": 0}],
                    "securityContext": {
                        "privileged": False,
                        "procMount": "Default",
                        "capabilities": {"add": sorted(BASELINE_CAPABILITIES), "drop": ["ALL"]},
                        "seLinuxOptions": {"type": "container_t", "level": "s0:c1"},
                        "windowsOptions": {"hostProcess": False},
                    },
                }
            ],
            securityContext={"sysctls": [{"name": n, "value": "1"} for n in sorted(SAFE_SYSCTLS)]},
        ),
        where="Pod/x spec",
    )


@pytest.mark.parametrize(
    "volume",
    [
        workdir_volume(f"{ROOT}/work"),  # the parent of every workdir
        workdir_volume(f"{ROOT}/work/{IID}/.."),
        workdir_volume(f"{ROOT}/work/../work/{IID}"),
        workdir_volume(f"{ROOT}//work/{IID}"),
        workdir_volume(f"{ROOT}/work/{IID}/"),
        workdir_volume(f"{ROOT}/work/{IID}/sub"),
        workdir_volume(f"{ROOT}/work/not-an-instance"),
        workdir_volume(f"/other/work/{IID}"),
        workdir_volume(f"{ROOT}/work/{IID}", kind="DirectoryOrCreate"),
        workdir_volume(f"{ROOT}/work/{IID}", kind=None),
        workdir_volume("/"),
        workdir_volume("/var/run/docker.sock", kind="Socket"),
    ],
)
def test_only_the_exact_workdir_hostpath_is_allowed(volume: dict[str, Any]) -> None:
    assert "hostPath volumes are not allowed" in refused(pod(volumes=[volume]), workdir_root=ROOT)


def test_the_workdir_hostpath_needs_a_workdir_root() -> None:
    check_pod_spec(pod(volumes=[workdir_volume()]), where="Pod/x spec", workdir_root=ROOT)
    assert refused(pod(volumes=[workdir_volume()])).endswith("hostPath volumes are not allowed")
    assert "only the daemon's workdir /var/lib/nymph/work/<instanceId> is" in refused(
        pod(volumes=[{"name": "v", "hostPath": {"path": "/"}}]), workdir_root=ROOT
    )


@given(st.text(alphabet="/.abcdefgwork-0123456789lakeshore", max_size=60))
def test_no_hostpath_but_a_workdir_passes(path: str) -> None:
    """Any path the policy lets through is exactly ``<root>/work/<instanceId>``."""
    spec = pod(volumes=[workdir_volume(path)])
    try:
        check_pod_spec(spec, where="Pod/x spec", workdir_root=ROOT)
    except PodPolicyError:
        return
    head, _, instance = path.rpartition("/")
    assert head == f"{ROOT}/work"
    assert instance.startswith("lakeshore-") and len(instance) == len(IID)


_BOOLS_AND_JUNK = st.one_of(st.booleans(), st.none(), st.integers(), st.text(max_size=5))


@given(
    field=st.sampled_from(["hostNetwork", "hostPID", "hostIPC"]),
    value=_BOOLS_AND_JUNK,
)
def test_host_namespaces_pass_only_when_off(field: str, value: object) -> None:
    spec = pod(**{field: value})
    if value is None or value is False:
        check_pod_spec(spec, where="Pod/x spec")
    else:
        assert f"spec.{field}" in refused(spec)


@given(caps=st.lists(st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ_", min_size=1, max_size=16), max_size=4))
def test_capabilities_pass_only_from_the_baseline_list(caps: list[str]) -> None:
    spec = pod(containers=[{"name": "c", "securityContext": {"capabilities": {"add": caps}}}])
    if set(caps) <= BASELINE_CAPABILITIES:
        check_pod_spec(spec, where="Pod/x spec")
    else:
        assert "capabilities.add[" in refused(spec)


def _rayjob() -> dict[str, Any]:
    tmpl = {"spec": pod()}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "x", "namespace": "jobs"},
        "spec": {
            "rayClusterSpec": {
                "headGroupSpec": {"template": copy.deepcopy(tmpl)},
                "workerGroupSpecs": [{"template": copy.deepcopy(tmpl)}, {"template": copy.deepcopy(tmpl)}],
            },
            "submitterPodTemplate": copy.deepcopy(tmpl),
        },
    }


def test_pod_templates_of_every_kind_are_found() -> None:
    deployment = {"kind": "Deployment", "metadata": {"name": "d"}, "spec": {"template": {"spec": pod()}}}
    cronjob = {
        "kind": "CronJob",
        "metadata": {"name": "c"},
        "spec": {"jobTemplate": {"spec": {"template": {"spec": pod()}}}},
    }
    cluster = {"kind": "RayCluster", "metadata": {"name": "r"}, "spec": _rayjob()["spec"]["rayClusterSpec"]}
    bare = {"kind": "Pod", "metadata": {"name": "p"}, "spec": pod()}
    service = {"kind": "Service", "metadata": {"name": "s"}, "spec": {"ports": []}}
    found = [t.where for t in pod_templates([deployment, service, _rayjob(), cluster, cronjob, bare])]
    assert found == [
        "Deployment/d spec.template.spec",
        "RayJob/x spec.rayClusterSpec.headGroupSpec.template.spec",
        "RayJob/x spec.rayClusterSpec.workerGroupSpecs[0].template.spec",
        "RayJob/x spec.rayClusterSpec.workerGroupSpecs[1].template.spec",
        "RayJob/x spec.submitterPodTemplate.spec",
        "RayCluster/r spec.headGroupSpec.template.spec",
        "RayCluster/r spec.workerGroupSpecs[0].template.spec",
        "RayCluster/r spec.workerGroupSpecs[1].template.spec",
        "CronJob/c spec.jobTemplate.spec.template.spec",
        "Pod/p spec",
    ]


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (
            ("rayClusterSpec", "headGroupSpec", "template"),
            "dockyard: RayJob/x spec.rayClusterSpec.headGroupSpec.template.spec.containers[0]"
            ".securityContext.privileged: privileged containers are not allowed",
        ),
        (
            ("rayClusterSpec", "workerGroupSpecs", 1, "template"),
            "dockyard: RayJob/x spec.rayClusterSpec.workerGroupSpecs[1].template.spec.containers[0]"
            ".securityContext.privileged: privileged containers are not allowed",
        ),
        (
            ("submitterPodTemplate",),
            "dockyard: RayJob/x spec.submitterPodTemplate.spec.containers[0]"
            ".securityContext.privileged: privileged containers are not allowed",
        ),
    ],
)
def test_check_manifests_names_the_template_and_field(path: tuple[Any, ...], expected: str) -> None:
    manifest = _rayjob()
    node: Any = manifest["spec"]
    for key in path:
        node = node[key]
    node["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    with pytest.raises(PodPolicyError) as info:
        check_manifests([manifest], prefix="dockyard: ")
    assert str(info.value) == expected


def test_the_autoscaler_sidecar_is_checked_too() -> None:
    manifest = _rayjob()
    manifest["spec"]["rayClusterSpec"]["autoscalerOptions"] = {"securityContext": {"privileged": True}}
    with pytest.raises(PodPolicyError) as info:
        check_manifests([manifest])
    assert info.value.field == "RayJob/x spec.rayClusterSpec.autoscalerOptions.securityContext.privileged"


def test_check_manifests_passes_clean_manifests() -> None:
    check_manifests([_rayjob(), {"kind": "Service", "metadata": {"name": "s"}, "spec": {}}])


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("runtime/default", True),
        ("localhost/my-profile", True),
        ("unconfined", False),
        ("", False),
        (1, False),
    ],
)
def test_apparmor_annotations_of_a_pod_template_are_held_to_baseline(value: object, ok: bool) -> None:
    key = "container.apparmor.security.beta.kubernetes.io/ray-head"
    manifest = _rayjob()
    head = manifest["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]
    head["metadata"] = {"annotations": {key: value, "other": "unconfined"}}
    if ok:
        check_manifests([manifest])
        return
    with pytest.raises(PodPolicyError) as info:
        check_manifests([manifest], prefix="dockyard: ")
    assert info.value.field == (
        f"dockyard: RayJob/x spec.rayClusterSpec.headGroupSpec.template.metadata.annotations[{key}]"
    )


def test_a_bare_pods_apparmor_annotation_is_checked() -> None:
    key = "container.apparmor.security.beta.kubernetes.io/user"
    bare = {"kind": "Pod", "metadata": {"name": "p", "annotations": {key: "unconfined"}}, "spec": pod()}
    with pytest.raises(PodPolicyError) as info:
        check_manifests([bare])
    assert info.value.field == f"Pod/p metadata.annotations[{key}]"
