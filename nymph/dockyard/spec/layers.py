"""Deep merge of configuration layers, remembering which layer set each key.

Mappings merge key by key; any other value (lists included) replaces what was there. The
:class:`Provenance` answers "which file did the value at this key path come from?", so an
error about ``infra.sandbox.port`` can name the file that set it.
"""

from __future__ import annotations

from typing import Any

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

    def lookup(self, path: KeyPath) -> str | None:
        """The source of the value at ``path`` (or of its nearest recorded ancestor)."""
        for i in range(len(path), -1, -1):
            found = self._origins.get(path[:i])
            if found is not None:
                return found
        return None


def merge(base: Any, layer: Any, *, source: str, provenance: Provenance, path: KeyPath = ()) -> Any:
    """``layer`` over ``base`` (neither is modified)."""
    if isinstance(base, dict) and isinstance(layer, dict):
        out = dict(base)
        for key, value in layer.items():
            out[key] = merge(base.get(key), value, source=source, provenance=provenance, path=(*path, key))
        return out
    provenance.record(path, source)
    return layer
