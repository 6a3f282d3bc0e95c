"""Typed Kubernetes JSON and small pure helpers shared by the dockyard builders."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import Enum
from typing import Any, NotRequired, TypedDict

#: nymph's own marker: its selectors (``cluster list``, sandbox pools) look for this one
MANAGED_BY_KEY = "nymph.io/managed-by"
MANAGED_BY = "nymph"
#: the marker dockyard-k8s sets and queries (``-l app.kubernetes.io/managed-by=dockyard-k8s``)
COMPAT_MANAGED_BY_KEY = "app.kubernetes.io/managed-by"
COMPAT_MANAGED_BY = "dockyard-k8s"
NAME_KEY = "app.kubernetes.io/name"


class ObjectMeta(TypedDict):
    name: str
    namespace: str
    labels: NotRequired[dict[str, str]]
    annotations: NotRequired[dict[str, str]]


class Manifest(TypedDict):
    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: dict[str, Any]


class EnvVar(TypedDict):
    name: str
    value: str


def labels(*layers: Mapping[str, str]) -> dict[str, str]:
    """Later layers win; the two managed-by markers always end up as rendered (nymph's own,
    and dockyard-k8s's so that its queries find the objects too)."""
    out: dict[str, str] = {}
    for layer in layers:
        out.update(layer)
    out[COMPAT_MANAGED_BY_KEY] = COMPAT_MANAGED_BY
    out[MANAGED_BY_KEY] = MANAGED_BY
    return out


def metadata(
    *,
    name: str,
    namespace: str,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> ObjectMeta:
    meta: ObjectMeta = {"name": name, "namespace": namespace}
    if labels:
        meta["labels"] = dict(labels)
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def env_list(env: Mapping[str, str]) -> list[EnvVar]:
    return [{"name": k, "value": v} for k, v in env.items()]


def env_value(container: Mapping[str, Any], name: str) -> str | None:
    """The literal value of env var ``name`` in a container (``None`` if absent/valueFrom)."""
    for entry in container.get("env") or []:
        if isinstance(entry, Mapping) and entry.get("name") == name:
            value = entry.get("value")
            return value if isinstance(value, str) else None
    return None


def env_upsert(container: dict[str, Any], env: Mapping[str, str]) -> None:
    """Add env vars the container does not already define (authored values win)."""
    existing = container.setdefault("env", [])
    present = {e.get("name") for e in existing if isinstance(e, Mapping)}
    for name, value in env.items():
        if name not in present:
            existing.append({"name": name, "value": value})


def env_set(container: dict[str, Any], name: str, value: str) -> None:
    """Set one env var, replacing an authored value."""
    existing = container.setdefault("env", [])
    for entry in existing:
        if isinstance(entry, dict) and entry.get("name") == name:
            entry.clear()
            entry.update({"name": name, "value": value})
            return
    existing.append({"name": name, "value": value})


def add_volume(pod_spec: dict[str, Any], volume: Mapping[str, Any]) -> None:
    volumes = pod_spec.setdefault("volumes", [])
    if not any(isinstance(v, Mapping) and v.get("name") == volume["name"] for v in volumes):
        volumes.append(dict(volume))


def add_mount(container: dict[str, Any], *, name: str, mount_path: str) -> None:
    mounts = container.setdefault("volumeMounts", [])
    if not any(isinstance(m, Mapping) and m.get("mountPath") == mount_path for m in mounts):
        mounts.append({"name": name, "mountPath": mount_path})


def plain(value: Any) -> Any:
    """JSON-shaped copy: tuples become lists, enums their values, mappings dicts."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def names_of(items: Iterable[Mapping[str, Any]]) -> list[str]:
    return [str(i.get("name")) for i in items]
