"""The GPU RayCluster (trainer + inference worker groups, or one plain Ray worker group) as a
RayJob or a RayCluster.

``infra.kuberay.spec`` is a free-form RayCluster ``.spec``. Rendering deep-copies it and:

* tags each worker group with its fleet role (:mod:`nymph.dockyard.render.fleets`; a plain
  Ray worker group gets none), fills ``minReplicas`` / ``maxReplicas`` from ``replicas`` (a
  fixed-size gang) and turns ``rayStartParams`` values into the strings the CRD requires;
* points the workers' well-known DRA claims at their cluster-unique templates
  (:mod:`nymph.dockyard.render.dra`);
* splits worker groups larger than ``kuberay.segmentSize`` into equal segments;
* on every pod (head and workers): the infra image on the Ray container (index 0; other
  containers keep their own), pull secrets, service account, ``priorityClassName`` (an
  authored one wins), labels, ``RAY_ENABLE_UV_RUN_RUNTIME_ENV=0`` and
  ``DOCKYARD_SANDBOX_URLS`` (authored env wins), the scheduler, placement, networking and
  storage settings, and the GPU hardening when ``security.enabled``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import yaml

from nymph.dockyard.errors import DockyardConfigError
from nymph.dockyard.render import dra, fleets, hardening, k8s
from nymph.dockyard.spec.enums import CheckpointsKind, HFCacheKind, SchedulerKind, WorkspaceKind
from nymph.dockyard.spec.schema import ClusterSpec, InfraConfig

API_VERSION = "ray.io/v1"
UV_ENV = "RAY_ENABLE_UV_RUN_RUNTIME_ENV"
SANDBOX_URLS_ENV = "DOCKYARD_SANDBOX_URLS"
KAI_SCHEDULER = "kai-scheduler"
KAI_QUEUE_LABEL = "kai.scheduler/queue"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
SUBMISSION_MODE = "HTTPMode"  # K8sJobMode adds a submitter Job outside the gang
TTL_SECONDS_AFTER_FINISHED = 3600
_SPEC = "infra.kuberay.spec"
#: the most segments one worker group is split into (a render never builds more groups)
MAX_SEGMENTS = 256


def _group_path(i: int) -> str:
    return f"{_SPEC}.workerGroupSpecs[{i}]"


def _pod_spec(group: Mapping[str, Any], *, where: str) -> dict[str, Any]:
    template = group.get("template")
    spec = template.get("spec") if isinstance(template, dict) else None
    containers = spec.get("containers") if isinstance(spec, dict) else None
    if not isinstance(spec, dict) or not isinstance(containers, list) or not containers:
        raise DockyardConfigError("needs template.spec.containers (a non-empty list)", path=where)
    for i, container in enumerate(containers):
        if not isinstance(container, dict):
            raise DockyardConfigError("expected a mapping", path=f"{where}.template.spec.containers[{i}]")
    return spec


def _stringify_params(group: dict[str, Any], *, where: str) -> None:
    params = group.get("rayStartParams")
    if params is None:
        return
    if not isinstance(params, dict):
        raise DockyardConfigError("expected a mapping", path=f"{where}.rayStartParams")
    for key, value in params.items():
        if isinstance(value, bool):
            params[key] = "true" if value else "false"
        elif isinstance(value, int | float):
            params[key] = str(value)
        elif not isinstance(value, str):
            raise DockyardConfigError(
                "expected a string (rayStartParams values are strings)",
                path=f"{where}.rayStartParams.{key}",
            )


def _segments(group: dict[str, Any], i: int, size: int | None) -> list[dict[str, Any]]:
    replicas = group.get("replicas")
    if size is None or not isinstance(replicas, int) or replicas <= size:
        return [group]
    if replicas % size:
        raise DockyardConfigError(
            f"replicas {replicas} is not a multiple of kuberay.segmentSize {size}",
            path=f"{_group_path(i)}.replicas",
        )
    if replicas // size > MAX_SEGMENTS:
        raise DockyardConfigError(
            f"replicas {replicas} in segments of kuberay.segmentSize {size} makes "
            f"{replicas // size} worker groups; at most {MAX_SEGMENTS}",
            path=f"{_group_path(i)}.replicas",
        )
    out: list[dict[str, Any]] = []
    for n in range(replicas // size):
        segment = copy.deepcopy(group)
        segment.update(
            groupName=f"{group['groupName']}-segment-{n}", replicas=size, minReplicas=size, maxReplicas=size
        )
        out.append(segment)
    return out


def _authored_groups(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The authored worker groups, checked (a name, a pod template, string start params)."""
    raw = spec.get("workerGroupSpecs")
    if not isinstance(raw, list) or not raw:
        raise DockyardConfigError(
            "needs worker groups (a trainer and an inference group, or one plain Ray worker group)",
            path=f"{_SPEC}.workerGroupSpecs",
        )
    for i, group in enumerate(raw):
        where = _group_path(i)
        if not isinstance(group, dict):
            raise DockyardConfigError("expected a mapping", path=where)
        if not isinstance(group.get("groupName"), str) or not group["groupName"]:
            raise DockyardConfigError("required", path=f"{where}.groupName")
        _pod_spec(group, where=where)
        _stringify_params(group, where=where)
    return raw


def group_roles(cluster: ClusterSpec) -> list[fleets.GroupRole]:
    """The fleet role of each authored worker group of ``cluster`` and what it comes from."""
    spec: dict[str, Any] = k8s.plain(copy.deepcopy(cluster.spec))
    return fleets.group_roles(_authored_groups(spec), path=f"{_SPEC}.workerGroupSpecs")


def _worker_groups(spec: dict[str, Any], cluster: ClusterSpec, infra: InfraConfig) -> list[dict[str, Any]]:
    authored = _authored_groups(spec)
    dra.rewrite_claims(authored, cluster=cluster.name, dra=infra.dra)
    roles = fleets.group_roles(authored, path=f"{_SPEC}.workerGroupSpecs")
    groups: list[dict[str, Any]] = []
    for i, (group, found) in enumerate(zip(authored, roles, strict=True)):
        where = _group_path(i)
        if found.role is not None:
            fleets.tag_group(group, found.role, where=where)
        replicas = group.get("replicas")
        if replicas is None and ("minReplicas" not in group or "maxReplicas" not in group):
            raise DockyardConfigError("required (the number of pods of this group)", path=f"{where}.replicas")
        if replicas is not None:
            group.setdefault("minReplicas", replicas)
            group.setdefault("maxReplicas", replicas)
        groups.extend(_segments(group, i, cluster.segmentSize))
    return groups


def _storage(infra: InfraConfig) -> tuple[list[dict[str, Any]], list[tuple[str, str]], dict[str, str]]:
    """Volumes, (volume, mountPath) mounts for the Ray container, and env."""
    volumes: list[dict[str, Any]] = []
    mounts: list[tuple[str, str]] = []
    env: dict[str, str] = {}
    ws = infra.workspace
    if ws.kind in (WorkspaceKind.PVC, WorkspaceKind.LUSTRE):
        volumes.append({"name": "dockyard-workspace", "persistentVolumeClaim": {"claimName": ws.pvcName}})
        mounts.append(("dockyard-workspace", ws.mountPath))
    elif ws.kind is WorkspaceKind.HOST_PATH:
        volumes.append(
            {"name": "dockyard-workspace", "hostPath": {"path": ws.hostPath, "type": "DirectoryOrCreate"}}
        )
        mounts.append(("dockyard-workspace", ws.mountPath))
    hf = infra.hf_cache
    if hf.kind in (HFCacheKind.PVC, HFCacheKind.LUSTRE):
        volumes.append({"name": "hf-cache", "persistentVolumeClaim": {"claimName": hf.pvcName}})
    elif hf.kind is HFCacheKind.EMPTY_DIR:
        volumes.append({"name": "hf-cache", "emptyDir": {}})
    if hf.kind is not HFCacheKind.NONE:
        mounts.append(("hf-cache", hf.mountPath))
        env["HF_HOME"] = hf.mountPath
    ck = infra.checkpoints
    if ck.kind in (CheckpointsKind.PVC, CheckpointsKind.LUSTRE):
        volumes.append({"name": "checkpoints", "persistentVolumeClaim": {"claimName": ck.pvcName}})
        mounts.append(("checkpoints", ck.mountPath))
    return volumes, mounts, env


def _networking_env(infra: InfraConfig) -> dict[str, str]:
    net = infra.networking
    env: dict[str, str] = {}
    if net.gloo_socket_ifname:
        env["GLOO_SOCKET_IFNAME"] = net.gloo_socket_ifname
    if net.nccl_socket_ifname:
        env["NCCL_SOCKET_IFNAME"] = net.nccl_socket_ifname
    if net.nccl_ib_disable:
        env["NCCL_IB_DISABLE"] = "1"
    if net.nccl_net:
        env["NCCL_NET"] = net.nccl_net
    env.update(net.extra_env)
    return env


def _pod_labels(infra: InfraConfig, cluster: ClusterSpec) -> dict[str, str]:
    extra: dict[str, str] = {}
    if infra.scheduler.kind is SchedulerKind.KAI and infra.scheduler.queue:
        extra[KAI_QUEUE_LABEL] = infra.scheduler.queue
    return k8s.labels(extra, infra.labels, cluster.labels)


def object_labels(infra: InfraConfig, cluster: ClusterSpec) -> dict[str, str]:
    queue = infra.scheduler.queue
    extra: dict[str, str] = {}
    if infra.scheduler.kind is SchedulerKind.KAI and queue:
        extra[KAI_QUEUE_LABEL] = queue
    elif infra.scheduler.kind is SchedulerKind.KUEUE and queue:
        extra[KUEUE_QUEUE_LABEL] = queue
    return k8s.labels(extra, infra.labels, cluster.labels)


def _patch_pod(
    group: dict[str, Any], infra: InfraConfig, cluster: ClusterSpec, cross_env: Mapping[str, str]
) -> None:
    template: dict[str, Any] = group["template"]
    meta = dict(template.get("metadata") or {})
    meta["labels"] = {**_pod_labels(infra, cluster), **(meta.get("labels") or {}), **k8s.labels()}
    group["template"] = {"metadata": meta, **{k: v for k, v in template.items() if k != "metadata"}}
    pod = template["spec"]
    containers: list[dict[str, Any]] = pod["containers"]
    containers[0]["image"] = infra.image
    for container in containers[1:]:
        container.setdefault("image", infra.image)
    volumes, mounts, storage_env = _storage(infra)
    env = {**cross_env, **_networking_env(infra), **storage_env}
    pod_sc, container_sc = hardening.security_contexts(infra.security)
    for container in containers:
        k8s.env_upsert(container, env)
        if container_sc:
            container.setdefault("securityContext", copy.deepcopy(container_sc))
    for volume in volumes:
        k8s.add_volume(pod, volume)
    for name, path in mounts:
        k8s.add_mount(containers[0], name=name, mount_path=path)
    if pod_sc:
        pod.setdefault("securityContext", pod_sc)
    if infra.imagePullSecrets:
        known = k8s.names_of(pod.get("imagePullSecrets") or [])
        pod["imagePullSecrets"] = [
            *(pod.get("imagePullSecrets") or []),
            *({"name": s} for s in infra.imagePullSecrets if s not in known),
        ]
    if infra.serviceAccount is not None:
        pod["serviceAccountName"] = infra.serviceAccount
    if infra.priorityClassName is not None:
        pod.setdefault("priorityClassName", infra.priorityClassName)
    if infra.scheduler.kind is SchedulerKind.KAI:
        pod.setdefault("schedulerName", KAI_SCHEDULER)
    placement = infra.placement
    if placement.nodeSelector:
        pod["nodeSelector"] = {**placement.nodeSelector, **(pod.get("nodeSelector") or {})}
    if placement.tolerations:
        tolerations = list(pod.get("tolerations") or [])
        for t in placement.tolerations:
            entry = {k: v for k, v in k8s.plain(t.model_dump()).items() if v is not None}
            if entry not in tolerations:
                tolerations.append(entry)
        pod["tolerations"] = tolerations
    if placement.affinity is not None:
        pod.setdefault("affinity", k8s.plain(placement.affinity))
    if infra.networking.hostNetwork:
        pod.setdefault("hostNetwork", True)
        pod.setdefault("dnsPolicy", "ClusterFirstWithHostNet")


def cluster_spec(infra: InfraConfig, *, cross_env: Mapping[str, str]) -> dict[str, Any]:
    """The patched RayCluster ``.spec`` (see the module docstring)."""
    cluster = infra.kuberay
    if cluster is None:
        raise DockyardConfigError("required for this launch mode", path="infra.kuberay")
    spec: dict[str, Any] = k8s.plain(copy.deepcopy(cluster.spec))
    head = spec.get("headGroupSpec")
    if not isinstance(head, dict):
        raise DockyardConfigError("required (a mapping with template)", path=f"{_SPEC}.headGroupSpec")
    _pod_spec(head, where=f"{_SPEC}.headGroupSpec")
    _stringify_params(head, where=f"{_SPEC}.headGroupSpec")
    spec["workerGroupSpecs"] = _worker_groups(spec, cluster, infra)
    if infra.rayVersion is not None:
        spec.setdefault("rayVersion", infra.rayVersion)
    for group in [head, *spec["workerGroupSpecs"]]:
        _patch_pod(group, infra, cluster, cross_env)
    return spec


def _meta(infra: InfraConfig, cluster: ClusterSpec) -> k8s.ObjectMeta:
    return k8s.metadata(
        name=cluster.name,
        namespace=infra.namespace,
        labels=object_labels(infra, cluster),
        annotations={**infra.annotations, **cluster.annotations},
    )


def raycluster(infra: InfraConfig, *, cross_env: Mapping[str, str]) -> k8s.Manifest:
    assert infra.kuberay is not None
    return {
        "apiVersion": API_VERSION,
        "kind": "RayCluster",
        "metadata": _meta(infra, infra.kuberay),
        "spec": cluster_spec(infra, cross_env=cross_env),
    }


def rayjob(
    infra: InfraConfig, *, cross_env: Mapping[str, str], max_runtime: int | None = None
) -> k8s.Manifest:
    """The RayJob; with ``max_runtime`` (seconds: a namespace's runtime cap) its
    ``spec.activeDeadlineSeconds`` (KubeRay then fails the job with ``DeadlineExceeded``)."""
    assert infra.kuberay is not None
    if not infra.launch.entrypoint:
        raise DockyardConfigError("required when launch.mode is rayjob", path="infra.launch.entrypoint")
    spec: dict[str, Any] = {
        "entrypoint": infra.launch.entrypoint,
        "submissionMode": SUBMISSION_MODE,
        "shutdownAfterJobFinishes": True,
        "ttlSecondsAfterFinished": TTL_SECONDS_AFTER_FINISHED,
    }
    if max_runtime is not None:
        spec["activeDeadlineSeconds"] = max_runtime
    if infra.launch.env:
        spec["runtimeEnvYAML"] = yaml.safe_dump(
            {"env_vars": dict(infra.launch.env)}, sort_keys=False, default_flow_style=False
        )
    spec["rayClusterSpec"] = cluster_spec(infra, cross_env=cross_env)
    return {
        "apiVersion": API_VERSION,
        "kind": "RayJob",
        "metadata": _meta(infra, infra.kuberay),
        "spec": spec,
    }
