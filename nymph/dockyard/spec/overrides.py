"""Hydra-style command-line overrides: ``infra.scheduler.queue=team-a``, ``grpo.steps=10``.

* ``KEY=VALUE`` sets a key (``+KEY=VALUE`` and ``++KEY=VALUE`` are accepted and mean the
  same); missing intermediate mappings are created; ``~KEY`` deletes a key.
* ``VALUE`` is parsed as YAML (``8`` is an int, ``[a, b]`` a list, ``null`` null); an empty
  value is the empty string.
* Keys are dotted; a numeric part indexes an existing list (``tolerations.0.key``).
* Keys under ``infra.`` target the infra spec (the prefix is dropped); all others target the
  recipe.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import yaml

from nymph.dockyard.errors import DockyardConfigError
from nymph.dockyard.spec.keypath import KeyPath, fmt

_KEY_PART = re.compile(r"^[A-Za-z0-9_\-/]+$")


@dataclass(frozen=True, kw_only=True)
class Override:
    text: str
    target: Literal["recipe", "infra"]
    path: KeyPath
    delete: bool
    value: Any = None

    @property
    def source(self) -> str:
        return f"override {self.text!r}"


def _parse_value(raw: str, *, text: str) -> Any:
    if raw == "":
        return ""
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        raise DockyardConfigError(
            "value is not valid YAML (quote it: KEY='VALUE')", source=f"override {text!r}"
        ) from None


def parse_override(text: str) -> Override:
    body = text
    delete = False
    if body.startswith("~"):
        delete, body = True, body[1:]
    else:
        body = body.lstrip("+") if body.startswith("+") else body
    key, sep, raw = body.partition("=")
    if delete and sep and raw:
        raise DockyardConfigError("a deletion takes no value: ~KEY", source=f"override {text!r}")
    if not delete and not sep:
        raise DockyardConfigError("expected KEY=VALUE (or ~KEY to delete a key)", source=f"override {text!r}")
    parts = key.split(".")
    if not key or not all(_KEY_PART.match(p) for p in parts):
        raise DockyardConfigError(
            f"malformed key {key!r}: dotted names of letters, digits, '_', '-' or '/'",
            source=f"override {text!r}",
        )
    target: Literal["recipe", "infra"] = "recipe"
    if parts[0] == "infra":
        if len(parts) == 1:
            raise DockyardConfigError("set a key below infra (infra.KEY=VALUE)", source=f"override {text!r}")
        target, parts = "infra", parts[1:]
    path: KeyPath = tuple(int(p) if p.isdigit() else p for p in parts)
    value = None if delete else _parse_value(raw, text=text)
    return Override(text=text, target=target, path=path, delete=delete, value=value)


def parse_overrides(texts: Sequence[str]) -> list[Override]:
    return [parse_override(t) for t in texts]


def apply_override(tree: dict[str, Any], override: Override) -> None:
    """Apply one override to ``tree`` in place."""
    node: Any = tree
    label = ("infra",) if override.target == "infra" else ()
    for i, part in enumerate(override.path[:-1]):
        here = (*label, *override.path[: i + 1])
        if isinstance(node, list) and isinstance(part, int):
            if not 0 <= part < len(node):
                raise DockyardConfigError(
                    f"index out of range (the list has {len(node)} items)",
                    path=fmt(here),
                    source=override.source,
                )
            node = node[part]
            continue
        if not isinstance(node, dict):
            raise DockyardConfigError(
                "cannot descend into a value that is not a mapping",
                path=fmt(here[:-1]),
                source=override.source,
            )
        key = str(part)
        child = node.get(key)
        if child is None:
            if override.delete:
                raise DockyardConfigError("no such key to delete", path=fmt(here), source=override.source)
            child = node[key] = {}
        node = child
    last = override.path[-1]
    full = (*label, *override.path)
    if isinstance(node, list) and isinstance(last, int):
        if not 0 <= last < len(node):
            raise DockyardConfigError(
                f"index out of range (the list has {len(node)} items)",
                path=fmt(full),
                source=override.source,
            )
        if override.delete:
            del node[last]
        else:
            node[last] = override.value
        return
    if not isinstance(node, dict):
        raise DockyardConfigError(
            "cannot set a key inside a value that is not a mapping",
            path=fmt(full[:-1]),
            source=override.source,
        )
    key = str(last)
    if override.delete:
        if key not in node:
            raise DockyardConfigError("no such key to delete", path=fmt(full), source=override.source)
        del node[key]
    else:
        node[key] = override.value
