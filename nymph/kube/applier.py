"""The apply path, as a protocol with two implementations: kubectl (default) and the API.

Both apply, delete Pods, read Pod logs and answer access questions (the probe uses them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from nymph import fastjson
from nymph.kube.errors import KubeError


@dataclass(frozen=True)
class ApplyOutcome:
    """What happened to one manifest of a batch."""

    namespace: str
    name: str
    error: KubeError | None = None
    obj: Mapping[str, Any] | None = None
    #: The API server's answer as it came, when ``obj`` was not decoded from it (the api
    #: applier: a launch reads nothing of the Pod it created, and decoding it cost a fortieth
    #: of the daemon's CPU under a burst); :meth:`live` decodes it.
    body: bytes | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def live(self) -> Mapping[str, Any] | None:
        """The object as applied (decoded from :attr:`body` when it came undecoded)."""
        if self.obj is not None or self.body is None:
            return self.obj
        decoded: Mapping[str, Any] = fastjson.loads(self.body)
        return decoded


class Applier(Protocol):
    name: str

    async def apply(
        self, manifests: Sequence[Mapping[str, Any]], *, dry_run: bool = False
    ) -> list[ApplyOutcome]:
        """Server-side apply (field manager ``nymph``); one outcome per manifest, same order."""

    async def delete_pod(
        self, *, namespace: str, name: str, grace_seconds: int | None, uid: str | None = None
    ) -> bool:
        """Delete a Pod. True if a deletion was issued, False if it was already gone. ``uid``:
        the Pod as a watch of nymph's Pods saw it (an applier that can, deletes only that
        Pod, without reading it first; False when another has taken its name)."""

    async def pod_logs(self, *, namespace: str, name: str, limit_bytes: int) -> str:
        """The last ``limit_bytes`` of the user container's log."""

    async def can_i(self, *, verb: str, resource: str, namespace: str) -> bool:
        """Whether this identity may ``verb`` ``resource`` in ``namespace`` (False when unsure)."""


def object_key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or "default"), str(meta.get("name") or "")
