"""Which launch a Pod belongs to: the ``nymph.io/launch`` annotation (pure).

A Pod is named after its instance id, and ids can collide (32 random bits, old instances are
kept), so a Pod of the right name is not proof that it is this launch's Pod. Every Pod the
daemon applies carries an annotation identifying its launch; the daemon adopts an existing Pod
only when that annotation matches, and fails the launch (Conflict) when it does not.

The key and value are the ones :mod:`nymph.launch.render` writes: the spec's ``launchUid``
(random, given by the queue) or, for a spec without one, a digest of the whole spec. A manifest
rendered with the annotation keeps it; one rendered without gets it here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nymph.launch.render import ANNOTATION_LAUNCH, PodManifest, launch_annotation
from nymph.launch.spec import LaunchSpec

__all__ = ["ANNOTATION_LAUNCH", "annotate", "is_launch_pod", "launch_identity", "pod_identity"]


def launch_identity(spec: LaunchSpec) -> str:
    """The annotation value of ``spec``'s Pod (as the render writes it)."""
    return launch_annotation(spec)


def annotate(manifest: PodManifest, identity: str) -> str:
    """Make sure ``manifest`` carries a launch annotation; the value it carries."""
    annotations = manifest["metadata"].setdefault("annotations", {})
    return annotations.setdefault(ANNOTATION_LAUNCH, identity)


def pod_identity(pod: Mapping[str, Any]) -> str | None:
    """The launch annotation of a Pod (from the watch cache or an API answer)."""
    meta = pod.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    value = annotations.get(ANNOTATION_LAUNCH) if isinstance(annotations, Mapping) else None
    return value if isinstance(value, str) else None


def is_launch_pod(pod: Mapping[str, Any], identity: str) -> bool:
    """Whether ``pod`` was created for the launch identified by ``identity``."""
    return pod_identity(pod) == identity
