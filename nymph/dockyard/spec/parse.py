"""Strict validation of a resolved infra mapping into :class:`~nymph.dockyard.spec.schema.InfraConfig`.

pydantic validates (strict models, ``extra="forbid"``); this module turns its first error
into nymph's own message, with the key path and the file the value came from:

* an unknown key names the allowed keys of its block;
* a missing required key is ``required``; a null where a value is needed ``must not be null``;
* type errors say what was expected and what was given (``expected an integer, got string 'two'``);
* then every block's ``problems()`` (cross-field rules) is checked, inner blocks first.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from nymph.dockyard.errors import DockyardConfigError
from nymph.dockyard.spec.fieldtypes import Block, describe
from nymph.dockyard.spec.keypath import KeyPath, fmt
from nymph.dockyard.spec.schema import InfraConfig

Origin = Callable[[KeyPath], str | None]

_EXPECTED = {
    "int_type": "an integer",
    "int_from_float": "an integer",
    "bool_type": "true or false",
    "string_type": "a string",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "dict_type": "a mapping",
    "mapping_type": "a mapping",
    "tuple_type": "a list",
    "list_type": "a list",
}


def _data_path(data: Any, loc: tuple[int | str, ...], *, keep_last: bool) -> KeyPath:
    """The key path of an error: pydantic's location without its union / validator tags."""
    out: list[str | int] = []
    node = data
    for i, part in enumerate(loc):
        in_list = isinstance(node, list | tuple) and isinstance(part, int) and 0 <= part < len(node)
        if in_list or (isinstance(node, Mapping) and part in node):
            out.append(part)
            node = node[part]
        elif keep_last and i == len(loc) - 1:
            out.append(part)
    return tuple(out)


def _unwrap(tp: Any) -> Any:
    """The block class inside ``Annotated[...]``, ``X | None``, ``tuple[X, ...]``."""
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (types.UnionType, typing.Union):
            options = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(options) != 1:
                return tp
            tp = options[0]
        elif origin is tuple:
            tp = typing.get_args(tp)[0]
        else:
            return tp


def _block_at(path: KeyPath) -> type[BaseModel] | None:
    cls: Any = InfraConfig
    for part in path:
        if isinstance(part, int):
            continue
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or part not in cls.model_fields:
            return None
        cls = _unwrap(cls.model_fields[part].annotation)
    return cls if isinstance(cls, type) and issubclass(cls, BaseModel) else None


def _message(err: Any, path: KeyPath) -> str:
    kind, given = err["type"], err.get("input")
    if kind == "missing":
        return "required"
    if kind == "extra_forbidden":
        block = _block_at(path[:-1])
        allowed = sorted(block.model_fields) if block is not None else []
        return f"unknown key (allowed: {', '.join(allowed)})"
    if kind == "value_error":
        return str(err["ctx"]["error"])
    if given is None:
        return "must not be null"
    if kind == "literal_error":
        expected = str(err["ctx"]["expected"]).replace("'", "").replace(" or ", ", ")
        return f"{describe(given)} is not allowed (allowed: {expected})"
    if kind in _EXPECTED:
        return f"expected {_EXPECTED[kind]}, got {describe(given)}"
    return str(err["msg"])


def _walk_problems(obj: Any, path: KeyPath, fail: Callable[[KeyPath, str], DockyardConfigError]) -> None:
    if isinstance(obj, tuple):
        for i, item in enumerate(obj):
            _walk_problems(item, (*path, i), fail)
        return
    if not isinstance(obj, Block):
        return
    for name in type(obj).model_fields:
        _walk_problems(getattr(obj, name), (*path, name), fail)
    for rel, message in obj.problems():
        raise fail((*path, *_rel_path(rel)), message)


def _rel_path(rel: str) -> KeyPath:
    out: list[str | int] = []
    for part in rel.replace("[", ".[").split("."):
        if part.startswith("[") and part.endswith("]"):
            out.append(int(part[1:-1]))
        elif part:
            out.append(part)
    return tuple(out)


def parse_infra(data: Any, *, origin: Origin | None = None, label: str = "infra") -> InfraConfig:
    """Build the typed :class:`InfraConfig` from a resolved mapping, strictly."""

    def fail(path: KeyPath, message: str) -> DockyardConfigError:
        full: KeyPath = ((label,) if label else ()) + path
        return DockyardConfigError(message, path=fmt(full), source=origin(path) if origin else None)

    if not isinstance(data, Mapping):
        raise fail((), f"expected a mapping, got {describe(data)}")
    for key in data:
        if not isinstance(key, str):
            raise fail((), f"keys must be strings, got {describe(key)}")
    try:
        infra = InfraConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        keep_last = err["type"] in ("missing", "extra_forbidden")
        path = _data_path(data, tuple(err["loc"]), keep_last=keep_last)
        raise fail(path, _message(err, path)) from None
    _walk_problems(infra, (), fail)
    return infra


def allowed_keys(cls: type[BaseModel]) -> list[str]:
    """The keys a block accepts (for help texts and errors)."""
    return sorted(cls.model_fields)
