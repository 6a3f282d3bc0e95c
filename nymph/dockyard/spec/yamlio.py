"""Strict YAML reading for recipes and infra files.

* duplicate keys in one mapping are an error (PyYAML would silently keep the last);
* anchors and aliases work (``<<:`` merge keys included), but every alias is expanded into
  an independent copy, so mutating one place never changes another and dumps carry no
  ``&id001`` anchors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from nymph.dockyard.errors import DockyardConfigError


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                continue  # the base class reports unhashable keys
            if key in seen:
                first = seen[key].start_mark.line + 1
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first at line {first})", key_node.start_mark
                )
            seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


def detach(value: Any, *, _depth: int = 0) -> Any:
    """A copy with no shared sub-objects (aliases expanded); refuses recursive aliases."""
    if _depth > 200:
        raise DockyardConfigError("structure nested too deep (a recursive YAML alias?)")
    if isinstance(value, dict):
        return {k: detach(v, _depth=_depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [detach(v, _depth=_depth + 1) for v in value]
    return value


def load_text(text: str, *, source: str) -> Any:
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}" if mark is not None else "?"
        problem = exc.problem or exc.context or "invalid YAML"
        raise DockyardConfigError(f"{where}: {problem}", source=source) from None
    except yaml.YAMLError as exc:
        raise DockyardConfigError(f"invalid YAML ({exc.__class__.__name__})", source=source) from None
    return detach(data)


def load_file(path: Path) -> Any:
    """Parse one YAML file; an empty file is ``None``."""
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DockyardConfigError("no such file", source=source) from None
    except IsADirectoryError:
        raise DockyardConfigError("is a directory, expected a YAML file", source=source) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DockyardConfigError(f"cannot read ({exc.__class__.__name__})", source=source) from None
    return load_text(text, source=source)
