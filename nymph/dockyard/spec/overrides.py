"""Hydra-style command-line overrides: ``infra.scheduler.queue=team-a``, ``grpo.steps=10``.

* ``KEY=VALUE`` sets a key (``+KEY=VALUE`` and ``++KEY=VALUE`` are accepted and mean the
  same); missing intermediate mappings are created; ``~KEY`` deletes a key.
* ``VALUE`` is parsed as YAML (``8`` is an int, ``[a, b]`` a list, ``null`` null); an empty
  value is the empty string.
* Keys are dotted; a numeric part indexes an existing list (``tolerations.0.key``).
* Keys under ``infra.`` target the infra spec (the prefix is dropped); all others target the
  recipe.

Parsing is nymph's (errors name the override); applying is OmegaConf's ``update``, after a
check for what it would do silently (replace a scalar to set a key below it).
"""

from __future__ import annotations

import re
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import yaml

from nymph.dockyard.errors import DockyardConfigError
from nymph.dockyard.spec.keypath import KeyPath, fmt

if TYPE_CHECKING:
    from omegaconf import DictConfig

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


def _check_parent(tree: DictConfig, override: Override) -> None:
    """Refuse what OmegaConf would silently do: replace a value to set a key below it,
    index past a list's end, delete a key that is not there."""
    from omegaconf import DictConfig, ListConfig

    label = ("infra",) if override.target == "infra" else ()
    node: Any = tree
    for i, part in enumerate(override.path):
        here = (*label, *override.path[: i + 1])
        if isinstance(node, ListConfig) and isinstance(part, int):
            if not 0 <= part < len(node):
                size = f"the list has {len(node)} items"
                raise DockyardConfigError(
                    f"index out of range ({size})", path=fmt(here), source=override.source
                )
            node = node._get_node(part)
        elif isinstance(node, DictConfig):
            if str(part) not in node or node._get_node(str(part))._is_none():  # type: ignore[union-attr]
                if override.delete and str(part) not in node:
                    raise DockyardConfigError("no such key to delete", path=fmt(here), source=override.source)
                return
            node = node._get_node(str(part))
        else:
            what = "set a key inside" if i == len(override.path) - 1 else "descend into"
            raise DockyardConfigError(
                f"cannot {what} a value that is not a mapping", path=fmt(here[:-1]), source=override.source
            )


def apply_override(tree: MutableMapping[str, Any] | DictConfig, override: Override) -> None:
    """Apply one override to ``tree`` in place (a plain mapping or an OmegaConf tree)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    cfg = tree if isinstance(tree, DictConfig) else OmegaConf.create(dict(tree))
    _check_parent(cfg, override)
    key = ".".join(str(p) for p in override.path)
    if override.delete:
        parent: Any = cfg
        for part in override.path[:-1]:
            parent = parent[part if isinstance(parent, ListConfig) else str(part)]
        last = override.path[-1]
        del parent[last if isinstance(parent, ListConfig) else str(last)]
    else:
        OmegaConf.update(cfg, key, override.value, merge=False, force_add=True)
    if not isinstance(tree, DictConfig):
        tree.clear()
        tree.update(OmegaConf.to_container(cfg, resolve=False))  # type: ignore[arg-type]
