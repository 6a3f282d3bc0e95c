"""Layered merge (OmegaConf's), remembering which layer set each key.

Mappings merge key by key; any other value (lists included) replaces what was there, as
``OmegaConf.merge`` does. The :class:`Provenance` answers "which file did the value at this
key path come from?", so an error about ``infra.sandbox.port`` can name the file that set it.
Interpolations are kept as written (resolved later, by :mod:`nymph.dockyard.spec.interp`).
"""

from __future__ import annotations

from typing import Any

from nymph.dockyard.errors import DockyardConfigError
from nymph.dockyard.spec.keypath import KeyPath


class Provenance:
    def __init__(self, *, root: str | None = None) -> None:
        self._origins: dict[KeyPath, str] = {}
        if root is not None:
            self._origins[()] = root

    def record(self, path: KeyPath, source: str) -> None:
        """``source`` set the whole value at ``path`` (forgetting older records below it)."""
        n = len(path)
        for known in [p for p in self._origins if len(p) > n and p[:n] == path]:
            del self._origins[known]
        self._origins[path] = source

    def record_layer(self, layer: Any, *, source: str, path: KeyPath = ()) -> None:
        """Every value ``layer`` sets (a mapping merges into what is below, the rest replaces)."""
        if isinstance(layer, dict) and (layer or not path):
            for key, value in layer.items():
                self.record_layer(value, source=source, path=(*path, key))
            return
        self.record(path, source)

    def lookup(self, path: KeyPath) -> str | None:
        """The source of the value at ``path`` (or of its nearest recorded ancestor)."""
        for i in range(len(path), -1, -1):
            found = self._origins.get(path[:i])
            if found is not None:
                return found
        return None


def merge(
    base: dict[str, Any], layer: dict[str, Any], *, source: str, provenance: Provenance
) -> dict[str, Any]:
    """``layer`` over ``base`` with ``OmegaConf.merge`` (neither is modified); plain mappings
    in and out."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        merged = OmegaConf.merge(OmegaConf.create(base), OmegaConf.create(layer))
    except (OmegaConfBaseException, TypeError, ValueError) as exc:
        key = getattr(exc, "full_key", None)
        text = str(exc).splitlines()[0]
        raise DockyardConfigError(
            f"cannot merge this layer: {text}", path=key or None, source=source
        ) from None
    provenance.record_layer(layer, source=source)
    out: dict[str, Any] = OmegaConf.to_container(merged, resolve=False)  # type: ignore[assignment]
    return out
