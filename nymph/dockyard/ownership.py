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
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any

from nymph.launch.names import is_instance_id

LAUNCH_LABEL = "nymph.io/launch"


class Ownership(StrEnum):
    ABSENT = "absent"  # no such object: this launch may create it
    OURS = "ours"  # carries this launch's label: this launch may apply over it and delete it
    FOREIGN = "foreign"  # exists and is not this launch's: never applied over, never deleted


def mark(manifests: Sequence[Mapping[str, Any]], *, launch: str) -> list[dict[str, Any]]:
    """Copies of ``manifests`` labelled as objects of ``launch`` (an instance id)."""
    if not is_instance_id(launch):
        raise ValueError(f"{launch!r} is not an instance id")
    out: list[dict[str, Any]] = []
    for manifest in manifests:
        marked = copy.deepcopy(dict(manifest))
        meta = marked.setdefault("metadata", {})
        meta["labels"] = {**(meta.get("labels") or {}), LAUNCH_LABEL: launch}
        out.append(marked)
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
