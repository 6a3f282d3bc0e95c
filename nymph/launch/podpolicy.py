"""One Pod policy for everything nymph renders from user input (pure).

The queue applies it to the Pod of a Pod launch and to every pod template of a dockyard
launch before it accepts them; local renders (``nymph render``, ``nymph dockyard render``) are
not restricted. It is Kubernetes Pod Security "baseline" plus one rule of nymph's own: no ``hostPath`` volume except
the daemon's workdir ``<root>/work/<instanceId>`` (``type: Directory``), and that one only where
a workdir root is given (a Pod launch on the daemon path; dockyard pod templates get none).

Refused, wherever it appears (``containers``, ``initContainers``, ``ephemeralContainers``):

* ``hostNetwork``, ``hostPID``, ``hostIPC``; any ``hostPort`` other than 0;
* ``securityContext.privileged``; ``capabilities.add`` beyond :data:`BASELINE_CAPABILITIES`;
* ``windowsOptions.hostProcess``; ``procMount`` other than ``Default``;
* a ``seccompProfile`` or ``appArmorProfile`` of type ``Unconfined``, and the same through the
  older ``container.apparmor.security.beta.kubernetes.io/*`` annotations of a pod template
  (:func:`check_manifests`);
* ``seLinuxOptions`` with a ``user`` or ``role``, or a ``type`` outside the container types;
* ``sysctls`` outside :data:`SAFE_SYSCTLS`;
* a value of the wrong shape in any of those places (Kubernetes would refuse it too, and a
  checker that skipped it would let it through).

Every refusal is a :class:`PodPolicyError` naming the field path, e.g.
``dockyard: RayJob/x spec.rayClusterSpec.headGroupSpec.template.spec.containers[0]
.securityContext.privileged: privileged containers are not allowed``.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nymph.errors import ValidationError
from nymph.launch.names import is_instance_id
from nymph.launch.render import workdir_path

#: Capabilities Pod Security "baseline" allows a container to add.
BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
#: Sysctls Pod Security "baseline" allows.
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
#: SELinux types Pod Security "baseline" allows (and the empty string).
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
HOST_NAMESPACES = ("hostNetwork", "hostPID", "hostIPC")


class PodPolicyError(ValidationError):
    """A rendered pod spec the Pod policy refuses; ``field`` is the full field path."""


APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"


@dataclass(frozen=True)
class PodTemplate:
    """One pod spec inside a rendered manifest: ``where`` is ``KIND/NAME FIELD.PATH`` of the
    spec, ``metadata`` the pod's (a template's ``metadata``, a Pod's own)."""

    where: str
    spec: Mapping[str, Any]
    metadata: Mapping[str, Any] = field(default_factory=dict)


def _refuse(where: str, message: str) -> PodPolicyError:
    return PodPolicyError(where, message)


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _refuse(where, "expected a mapping")
    return value


def _list(value: object, where: str) -> Sequence[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _refuse(where, "expected a list")
    return value


def _set(value: object) -> bool:
    """Whether a boolean field is switched on (anything but absent / false counts)."""
    return value is not None and value is not False


def check_security_context(ctx: object, *, where: str, container: bool) -> None:
    """The pod-level (``container=False``) or container-level ``securityContext``."""
    sc = _mapping(ctx, where)
    if container and _set(sc.get("privileged")):
        raise _refuse(f"{where}.privileged", "privileged containers are not allowed")
    windows = _mapping(sc.get("windowsOptions"), f"{where}.windowsOptions")
    if _set(windows.get("hostProcess")):
        raise _refuse(f"{where}.windowsOptions.hostProcess", "host process containers are not allowed")
    for profile in ("seccompProfile", "appArmorProfile"):
        prof = _mapping(sc.get(profile), f"{where}.{profile}")
        if prof.get("type") == "Unconfined":
            raise _refuse(f"{where}.{profile}.type", "an Unconfined profile is not allowed")
    selinux = _mapping(sc.get("seLinuxOptions"), f"{where}.seLinuxOptions")
    for key in ("user", "role"):
        if selinux.get(key) not in (None, ""):
            raise _refuse(f"{where}.seLinuxOptions.{key}", "setting the SELinux user or role is not allowed")
    if selinux.get("type") is not None and selinux.get("type") not in SELINUX_TYPES:
        raise _refuse(
            f"{where}.seLinuxOptions.type",
            f"allowed SELinux types: {', '.join(sorted(SELINUX_TYPES - {''}))}",
        )
    if container:
        if sc.get("procMount") not in (None, "Default"):
            raise _refuse(f"{where}.procMount", "only the Default procMount is allowed")
        caps = _mapping(sc.get("capabilities"), f"{where}.capabilities")
        for i, cap in enumerate(_list(caps.get("add"), f"{where}.capabilities.add")):
            if cap not in BASELINE_CAPABILITIES:
                raise _refuse(
                    f"{where}.capabilities.add[{i}]",
                    f"capability {cap!r} is not allowed (allowed: {', '.join(sorted(BASELINE_CAPABILITIES))})",
                )
    else:
        for i, sysctl in enumerate(_list(sc.get("sysctls"), f"{where}.sysctls")):
            name = _mapping(sysctl, f"{where}.sysctls[{i}]").get("name")
            if name not in SAFE_SYSCTLS:
                raise _refuse(f"{where}.sysctls[{i}].name", f"sysctl {name!r} is not allowed")


def check_container(container: object, *, where: str) -> None:
    """One container: its ``securityContext`` and its ``ports[].hostPort``."""
    c = _mapping(container, where)
    for i, port in enumerate(_list(c.get("ports"), f"{where}.ports")):
        host_port = _mapping(port, f"{where}.ports[{i}]").get("hostPort")
        if host_port not in (None, 0):
            raise _refuse(f"{where}.ports[{i}].hostPort", "host ports are not allowed")
    check_security_context(c.get("securityContext"), where=f"{where}.securityContext", container=True)


def _workdir_allowed(host_path: Mapping[str, Any], workdir_root: str | None) -> bool:
    path = host_path.get("path")
    if workdir_root is None or not isinstance(path, str) or host_path.get("type") != "Directory":
        return False
    instance = posixpath.basename(path)
    if not is_instance_id(instance):
        return False
    try:
        return path == workdir_path(workdir_root, instance)
    except ValidationError:
        return False


def check_volumes(volumes: object, *, where: str, workdir_root: str | None) -> None:
    """No ``hostPath`` volume but the daemon's workdir (only with a ``workdir_root``)."""
    for i, volume in enumerate(_list(volumes, where)):
        vol = _mapping(volume, f"{where}[{i}]")
        if "hostPath" not in vol:
            continue
        host_path = _mapping(vol.get("hostPath"), f"{where}[{i}].hostPath")
        if not _workdir_allowed(host_path, workdir_root):
            allowed = (
                f" (only the daemon's workdir {posixpath.normpath(workdir_root)}/work/<instanceId> is)"
                if workdir_root is not None
                else ""
            )
            raise _refuse(f"{where}[{i}].hostPath", f"hostPath volumes are not allowed{allowed}")


def check_pod_spec(spec: Mapping[str, Any], *, where: str, workdir_root: str | None = None) -> None:
    """Refuse a pod spec (a Pod's ``spec``, a template's ``spec``) the Pod policy forbids.

    ``where`` is the path of ``spec`` itself (``Pod/x spec``); the error's field is that path
    followed by the offending field. ``workdir_root`` allows the one ``hostPath`` the daemon
    mounts, ``<workdir_root>/work/<instanceId>``; without it no ``hostPath`` is allowed.
    """
    spec = _mapping(spec, where)
    for key in HOST_NAMESPACES:
        if _set(spec.get(key)):
            raise _refuse(f"{where}.{key}", "sharing the host's namespaces is not allowed")
    check_security_context(spec.get("securityContext"), where=f"{where}.securityContext", container=False)
    check_volumes(spec.get("volumes"), where=f"{where}.volumes", workdir_root=workdir_root)
    for kind in CONTAINER_LISTS:
        for i, container in enumerate(_list(spec.get(kind), f"{where}.{kind}")):
            check_container(container, where=f"{where}.{kind}[{i}]")


def check_pod_annotations(annotations: object, *, where: str) -> None:
    """A pod's annotations: no AppArmor profile but ``runtime/default`` or ``localhost/...``."""
    for key, value in _mapping(annotations, where).items():
        if not str(key).startswith(APPARMOR_ANNOTATION):
            continue
        if not isinstance(value, str) or not (value == "runtime/default" or value.startswith("localhost/")):
            raise _refuse(
                f"{where}[{key}]", "only the runtime/default or a localhost/ AppArmor profile is allowed"
            )


# --- finding pod templates in rendered manifests ------------------------------------------------


def _template(tmpl: object, at: str) -> Iterator[PodTemplate]:
    if tmpl is None:
        return
    t = _mapping(tmpl, at)
    yield PodTemplate(
        where=f"{at}.spec",
        spec=_mapping(t.get("spec"), f"{at}.spec"),
        metadata=_mapping(t.get("metadata"), f"{at}.metadata"),
    )


def _ray_cluster(spec: Mapping[str, Any], at: str) -> Iterator[PodTemplate]:
    head = _mapping(spec.get("headGroupSpec"), f"{at}.headGroupSpec")
    yield from _template(head.get("template"), f"{at}.headGroupSpec.template")
    for i, group in enumerate(_list(spec.get("workerGroupSpecs"), f"{at}.workerGroupSpecs")):
        worker = _mapping(group, f"{at}.workerGroupSpecs[{i}]")
        yield from _template(worker.get("template"), f"{at}.workerGroupSpecs[{i}].template")


def pod_templates(manifests: Sequence[Mapping[str, Any]]) -> list[PodTemplate]:
    """Every pod spec in ``manifests``: a Pod's ``spec``; the ``spec.template`` of a
    Deployment, StatefulSet, DaemonSet, ReplicaSet or Job (a CronJob's job template); a
    RayCluster's head and worker group templates; a RayJob's ``spec.rayClusterSpec`` likewise
    and its ``spec.submitterPodTemplate``; a RayService's ``spec.rayClusterConfig`` likewise."""
    found: list[PodTemplate] = []
    for manifest in manifests:
        meta = _mapping(manifest.get("metadata"), "metadata")
        name = f"{manifest.get('kind')}/{meta.get('name')}"
        kind = manifest.get("kind")
        spec = _mapping(manifest.get("spec"), f"{name} spec")
        if kind == "Pod":
            found.append(PodTemplate(where=f"{name} spec", spec=spec, metadata=meta))
        elif kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
            found.extend(_template(spec.get("template"), f"{name} spec.template"))
        elif kind == "CronJob":
            job = _mapping(spec.get("jobTemplate"), f"{name} spec.jobTemplate")
            job_spec = _mapping(job.get("spec"), f"{name} spec.jobTemplate.spec")
            found.extend(_template(job_spec.get("template"), f"{name} spec.jobTemplate.spec.template"))
        elif kind == "RayCluster":
            found.extend(_ray_cluster(spec, f"{name} spec"))
        elif kind == "RayJob":
            cluster = _mapping(spec.get("rayClusterSpec"), f"{name} spec.rayClusterSpec")
            found.extend(_ray_cluster(cluster, f"{name} spec.rayClusterSpec"))
            found.extend(_template(spec.get("submitterPodTemplate"), f"{name} spec.submitterPodTemplate"))
        elif kind == "RayService":
            cluster = _mapping(spec.get("rayClusterConfig"), f"{name} spec.rayClusterConfig")
            found.extend(_ray_cluster(cluster, f"{name} spec.rayClusterConfig"))
    return found


#: where each Ray kind keeps its cluster spec (KubeRay's autoscaler sidecar takes its
#: ``securityContext`` from that spec's ``autoscalerOptions``)
_RAY_CLUSTER_AT = {"RayCluster": (), "RayJob": ("rayClusterSpec",), "RayService": ("rayClusterConfig",)}


def _autoscaler(manifest: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]] | None:
    kind = manifest.get("kind")
    if kind not in _RAY_CLUSTER_AT:
        return None
    name = f"{kind}/{_mapping(manifest.get('metadata'), 'metadata').get('name')}"
    at = f"{name} spec"
    cluster = _mapping(manifest.get("spec"), at)
    for key in _RAY_CLUSTER_AT[str(kind)]:
        at = f"{at}.{key}"
        cluster = _mapping(cluster.get(key), at)
    at = f"{at}.autoscalerOptions"
    return at, _mapping(cluster.get("autoscalerOptions"), at)


def check_manifests(
    manifests: Sequence[Mapping[str, Any]], *, prefix: str = "", workdir_root: str | None = None
) -> None:
    """:func:`check_pod_spec` on every pod template of ``manifests`` (``where`` is
    ``prefix`` + the template's path), and the container rules on KubeRay's autoscaler."""
    for template in pod_templates(manifests):
        check_pod_spec(template.spec, where=prefix + template.where, workdir_root=workdir_root)
        at = prefix + template.where.removesuffix("spec") + "metadata.annotations"
        check_pod_annotations(template.metadata.get("annotations"), where=at)
    for manifest in manifests:
        autoscaler = _autoscaler(manifest)
        if autoscaler is not None:
            check_container(autoscaler[1], where=prefix + autoscaler[0])
