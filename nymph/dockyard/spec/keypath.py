"""Key paths into nested mappings: ``("infra", "placement", "tolerations", 0, "key")``."""

from __future__ import annotations

from typing import TypeAlias

KeyPath: TypeAlias = tuple[str | int, ...]


def fmt(path: KeyPath) -> str:
    """``infra.placement.tolerations[0].key``; the empty path is ``<root>``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out or "<root>"
