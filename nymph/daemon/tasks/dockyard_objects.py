"""The live side of dockyard objects on the daemon: what exists, and deleting only a launch's own.

* :func:`live_objects`: one ``kubectl get --ignore-not-found -o json`` of every rendered object
  (each one alone when that fails, so that each gets its own answer): the live object, ``None``
  when there is none (also when its kind is not served: no such object can exist), or the error.
* :func:`delete_owned`: reads the objects, and deletes each one that carries the launch's label
  (:mod:`nymph.dockyard.ownership`) with ``kubectl delete --raw PATH`` and its uid as a
  precondition, so the API server deletes exactly the object that was read and found to be the
  launch's: an object that is not the launch's is never deleted, whatever its name. (This
  needs only the ``get`` and ``delete`` verbs, which the daemon's dockyard Role grants.)
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from nymph.dockyard.ownership import Ownership, ownership
from nymph.errors import ValidationError
from nymph.kube.errors import KubeError, NotFound, classify_kubectl
from nymph.kube.kubectl import Kubectl
from nymph.launch.names import check_dns_subdomain, check_namespace
from nymph.launch.render import manifest_sha256

_GET_ARGS = ("get", "--ignore-not-found", "-o", "json")
_UNSERVED = (
    "doesn't have a resource type",
    "no matches for kind",
    "the server could not find the requested resource",
)

Live = Mapping[str, Any] | None | KubeError
#: the resource names of the kinds a dockyard launch applies
_PLURALS = {
    "Deployment": "deployments",
    "Service": "services",
    "NetworkPolicy": "networkpolicies",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "RayJob": "rayjobs",
    "RayCluster": "rayclusters",
    "RayService": "rayservices",
}


@dataclass(frozen=True)
class DockyardObject:
    """One rendered object, as the audit log, the messages and the task result name it."""

    api_version: str
    kind: str
    namespace: str
    name: str
    sha256: str

    @classmethod
    def of(cls, manifest: Mapping[str, Any]) -> DockyardObject:
        meta = manifest.get("metadata") or {}
        return cls(
            api_version=str(manifest.get("apiVersion") or ""),
            kind=str(manifest.get("kind") or ""),
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            sha256=manifest_sha256(manifest),
        )

    @property
    def ref(self) -> str:
        return f"{self.kind}/{self.name}"

    @property
    def resource(self) -> str:
        """How kubectl names the kind: ``deployment.apps``, ``service``, ``rayjob.ray.io``."""
        group = self.api_version.rpartition("/")[0]
        return f"{self.kind.lower()}{'.' + group if group else ''}"

    @property
    def printed_name(self) -> str:
        """How ``kubectl ... -o name`` prints it: ``deployment.apps/x``, ``service/x``."""
        return f"{self.resource}/{self.name}"

    def to_json(self) -> dict[str, str]:
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
            "manifestSha256": self.sha256,
        }


def _unserved(err: KubeError) -> bool:
    return isinstance(err, NotFound) or any(text in err.message for text in _UNSERVED)


def _items(stdout: str) -> dict[tuple[str, str], Mapping[str, Any]]:
    if not stdout.strip():
        return {}
    doc = json.loads(stdout)
    items = doc.get("items") if doc.get("kind") == "List" else [doc]
    out: dict[tuple[str, str], Mapping[str, Any]] = {}
    for item in items or []:
        if isinstance(item, dict):
            out[(str(item.get("kind")), str((item.get("metadata") or {}).get("name")))] = item
    return out


async def _get(
    kubectl: Kubectl, objs: Sequence[DockyardObject]
) -> dict[tuple[str, str], Mapping[str, Any]] | KubeError:
    res = await kubectl.run([*_GET_ARGS, f"--namespace={objs[0].namespace}", *(o.printed_name for o in objs)])
    if res.code != 0:
        return classify_kubectl(res.stderr)
    try:
        return _items(res.stdout)
    except (ValueError, AttributeError):
        return KubeError(f"kubectl get answered something that is not JSON: {res.stdout[:200]!r}")


async def live_objects(kubectl: Kubectl, manifests: Sequence[Mapping[str, Any]]) -> list[Live]:
    """For each manifest, in order: the live object, ``None`` (absent), or the error."""
    objs = [DockyardObject.of(m) for m in manifests]
    if not objs:
        return []
    if len({o.namespace for o in objs}) == 1:
        try:
            found = await _get(kubectl, objs)
        except KubeError as exc:
            return [exc for _ in objs]
        if not isinstance(found, KubeError):
            return [found.get((o.kind, o.name)) for o in objs]
    results: list[Live] = []
    for obj in objs:
        try:
            one = await _get(kubectl, [obj])
        except KubeError as exc:
            results.append(exc)
            continue
        if isinstance(one, KubeError):
            results.append(None if _unserved(one) else one)
        else:
            results.append(one.get((obj.kind, obj.name)))
    return results


class Deleted(StrEnum):
    DELETED = "deleted"
    ABSENT = "absent"  # no such object (also: its kind is not served)
    NOT_OWNED = "not-owned"  # exists and is not the launch's: left alone


def _object_path(obj: DockyardObject) -> str:
    """The object's API path, from names checked to be DNS names (no path can be smuggled in)."""
    check_namespace(obj.namespace)
    check_dns_subdomain(obj.name, field="metadata.name")
    plural = _PLURALS.get(obj.kind, obj.kind.lower() + "s")
    group, _, version = obj.api_version.rpartition("/")
    base = f"/apis/{group}/{version}" if group else f"/api/{version}"
    return f"{base}/namespaces/{obj.namespace}/{plural}/{obj.name}"


async def _delete_exactly(kubectl: Kubectl, obj: DockyardObject, uid: str) -> Deleted | KubeError:
    """DELETE the object only if it is still the one of ``uid`` (a precondition the API server
    checks): an object deleted and made again by someone else in between is not touched."""
    try:
        path = _object_path(obj)
    except ValidationError as exc:
        return KubeError(f"refusing to delete {obj.ref}: {exc}")
    body = {
        "kind": "DeleteOptions",
        "apiVersion": "v1",
        "propagationPolicy": "Background",
        "preconditions": {"uid": uid},
    }
    try:
        res = await kubectl.run(["delete", "--raw", path, "-f", "-"], stdin=json.dumps(body))
    except KubeError as exc:
        return exc
    if res.code == 0:
        return Deleted.DELETED
    err = classify_kubectl(res.stderr)
    if _unserved(err):
        return Deleted.ABSENT
    if "precondition" in err.message.lower():
        return Deleted.NOT_OWNED  # replaced since it was read: not the object that was ours
    return err


async def delete_owned(
    kubectl: Kubectl, manifests: Sequence[Mapping[str, Any]], *, launch: str
) -> list[Deleted | KubeError]:
    """Delete, in the order given, each object that carries ``launch``'s label (read first,
    then deleted with its uid as a precondition); any other object is left alone."""
    live = await live_objects(kubectl, manifests)
    results: list[Deleted | KubeError] = []
    for manifest, obj in zip(manifests, live, strict=True):
        if isinstance(obj, KubeError):
            results.append(obj)
        elif ownership(obj, launch=launch) is Ownership.ABSENT:
            results.append(Deleted.ABSENT)
        elif ownership(obj, launch=launch) is Ownership.FOREIGN:
            results.append(Deleted.NOT_OWNED)
        else:
            assert obj is not None
            uid = str((obj.get("metadata") or {}).get("uid") or "")
            if not uid:
                results.append(KubeError(f"{DockyardObject.of(manifest).ref} has no uid"))
                continue
            results.append(await _delete_exactly(kubectl, DockyardObject.of(manifest), uid))
    return results
