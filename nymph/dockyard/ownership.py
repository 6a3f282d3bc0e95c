"""Which dockyard launch an object belongs to: the ``nymph.io/launch`` label (pure).

A dockyard launch names its objects after the infra (``sandbox.name``, ``kuberay.name``), so a
name says nothing about who owns the object: an administrator's NetworkPolicy can have the name
a launch asks for. The daemon labels every object it applies with the launch's instance id,
applies an object only when it is absent or already carries that label, and deletes only
objects that carry it (the delete itself selects on the label, so the API server re-checks it).
Pods say the same with the ``nymph.io/launch`` annotation (:mod:`nymph.daemon.tasks.identity`);
a dockyard object carries a label so that the delete can select on it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any

from nymph.launch.names import is_instance_id

LAUNCH_LABEL = "nymph.io/launch"
#: on a launch's RayJob: its other objects (``[{apiVersion, kind, name}, ...]`` as JSON), which
#: the daemon deletes by name when the RayJob ends (:mod:`nymph.daemon.rayjobends`)
POOL_ANNOTATION = "nymph.io/launch-objects"


class Ownership(StrEnum):
    ABSENT = "absent"  # no such object: this launch may create it
    OURS = "ours"  # carries this launch's label: this launch may apply over it and delete it
    FOREIGN = "foreign"  # exists and is not this launch's: never applied over, never deleted


def mark(manifests: Sequence[Mapping[str, Any]], *, launch: str) -> list[dict[str, Any]]:
    """Copies of ``manifests`` labelled as objects of ``launch`` (an instance id); a RayJob
    among them also names the others (:data:`POOL_ANNOTATION`)."""
    if not is_instance_id(launch):
        raise ValueError(f"{launch!r} is not an instance id")
    out: list[dict[str, Any]] = []
    for manifest in manifests:
        marked = copy.deepcopy(dict(manifest))
        meta = marked.setdefault("metadata", {})
        meta["labels"] = {**(meta.get("labels") or {}), LAUNCH_LABEL: launch}
        out.append(marked)
    others = [
        {
            "apiVersion": m.get("apiVersion"),
            "kind": m.get("kind"),
            "name": (m.get("metadata") or {}).get("name"),
        }
        for m in out
        if m.get("kind") != "RayJob"
    ]
    for marked in out:
        if marked.get("kind") == "RayJob" and others:
            meta = marked["metadata"]
            meta["annotations"] = {**(meta.get("annotations") or {}), POOL_ANNOTATION: json.dumps(others)}
    return out


def companions(rayjob: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The other objects of a RayJob's launch, as name-only manifests (from
    :data:`POOL_ANNOTATION`; none when it is absent or not a list of such objects)."""
    meta = rayjob.get("metadata") or {}
    namespace = meta.get("namespace")
    raw = (meta.get("annotations") or {}).get(POOL_ANNOTATION)
    try:
        listed = json.loads(raw) if isinstance(raw, str) else []
    except ValueError:
        return []
    out: list[dict[str, Any]] = []
    for item in listed if isinstance(listed, list) else []:
        if isinstance(item, dict) and all(
            isinstance(item.get(k), str) for k in ("apiVersion", "kind", "name")
        ):
            out.append(
                {
                    "apiVersion": item["apiVersion"],
                    "kind": item["kind"],
                    "metadata": {"name": item["name"], "namespace": namespace},
                }
            )
    return out


def owner_of(obj: Mapping[str, Any]) -> str | None:
    """The launch label of a live object (as ``kubectl get -o json`` shows it)."""
    meta = obj.get("metadata")
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    value = labels.get(LAUNCH_LABEL) if isinstance(labels, Mapping) else None
    return value if isinstance(value, str) else None


def ownership(live: Mapping[str, Any] | None, *, launch: str) -> Ownership:
    """How the live object of a rendered one (``None``: it does not exist) relates to ``launch``."""
    if live is None:
        return Ownership.ABSENT
    return Ownership.OURS if owner_of(live) == launch else Ownership.FOREIGN
