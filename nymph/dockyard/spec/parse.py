"""Strict conversion of a plain mapping into the :mod:`~nymph.dockyard.spec.schema` dataclasses.

Driven by the dataclasses' type hints, so the schema is written once. Rules:

* unknown keys are errors naming the key path and listing the allowed keys;
* a missing key takes the default of the enclosing field (see the schema docstring), a
  missing required key is an error;
* ``str`` fields accept integers (``queue: 1``) but not floats or booleans, which YAML would
  mangle (``2.50`` -> ``2.5``; quote them); quantities accept integers and floats;
* every dataclass's ``problems()`` is checked after construction.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Any, TypeVar

from nymph.dockyard.errors import DockyardConfigError
from nymph.dockyard.spec.keypath import KeyPath, fmt
from nymph.dockyard.spec.schema import InfraConfig, Quantity

T = TypeVar("T")
Origin = Callable[[KeyPath], str | None]
_REL_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


@dataclasses.dataclass(frozen=True)
class _Ctx:
    label: str
    origin: Origin | None

    def error(self, path: KeyPath, message: str) -> DockyardConfigError:
        full: KeyPath = ((self.label,) if self.label else ()) + path
        return DockyardConfigError(message, path=fmt(full), source=self.origin(path) if self.origin else None)


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, int | float):
        return f"number {value!r}"
    if isinstance(value, str):
        return f"string {value!r}"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return type(value).__name__


def _rel_path(rel: str) -> KeyPath:
    return tuple(int(index) if index else name for name, index in _REL_PART.findall(rel))


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _default_of(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _parse_dataclass(cls: type[T], data: Any, path: KeyPath, base: Any, ctx: _Ctx) -> T:
    if not isinstance(data, Mapping):
        raise ctx.error(path, f"expected a mapping, got {_describe(data)}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    for key in data:
        if not isinstance(key, str):
            raise ctx.error(path, f"keys must be strings, got {_describe(key)}")
        if key not in fields:
            raise ctx.error((*path, key), f"unknown key (allowed: {', '.join(sorted(fields))})")
    hints = _hints(cls)
    exclusive: tuple[str, ...] = getattr(cls, "exclusive", ())
    partial_exclusive = any(k in data for k in exclusive)
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        if name in data:
            sub_base = getattr(base, name) if base is not None else _default_of(f)
            if sub_base is dataclasses.MISSING:
                sub_base = None
            kwargs[name] = _convert(hints[name], data[name], (*path, name), sub_base, ctx)
        elif name in exclusive and partial_exclusive:
            kwargs[name] = None
        elif base is not None:
            kwargs[name] = getattr(base, name)
        else:
            default = _default_of(f)
            if default is dataclasses.MISSING:
                raise ctx.error((*path, name), "required")
            kwargs[name] = default
    obj = cls(**kwargs)
    problems = getattr(obj, "problems", None)
    if problems is not None:
        for rel, message in problems():
            raise ctx.error((*path, *_rel_path(rel)), message)
    return obj


def _convert_scalar(tp: Any, value: Any, path: KeyPath, ctx: _Ctx) -> Any:
    if tp is Quantity:
        if isinstance(value, str) and value.strip():
            return value.strip()
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(int(value)) if float(value).is_integer() else repr(value)
        raise ctx.error(path, f"expected a quantity ('500m', '2Gi', 4), got {_describe(value)}")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        raise ctx.error(path, f"expected a string, got {_describe(value)} (quote it)")
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ctx.error(path, f"expected true or false, got {_describe(value)}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ctx.error(path, f"expected an integer, got {_describe(value)}")
    if isinstance(tp, type) and issubclass(tp, StrEnum):
        allowed = [m.value for m in tp]
        if isinstance(value, str) and value in allowed:
            return tp(value)
        raise ctx.error(path, f"{_describe(value)} is not allowed (allowed: {', '.join(allowed)})")
    raise TypeError(f"unsupported schema type {tp!r}")  # pragma: no cover - schema bug


def _accepts(tp: Any, value: Any) -> bool:
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    return False


def _convert(tp: Any, value: Any, path: KeyPath, base: Any, ctx: _Ctx) -> Any:
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is types.UnionType or origin is typing.Union:
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return _convert(options[0], value, path, base, ctx)
        for option in options:
            if _accepts(option, value):
                return value
        names = " or ".join(getattr(o, "__name__", str(o)) for o in options)
        raise ctx.error(path, f"expected {names}, got {_describe(value)}")
    if value is None:
        raise ctx.error(path, "must not be null")
    if origin is typing.Literal:
        if any(value == a and type(value) is type(a) for a in args):
            return value
        allowed = ", ".join(str(a) for a in args)
        raise ctx.error(path, f"{_describe(value)} is not allowed (allowed: {allowed})")
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ctx.error(path, f"expected a list, got {_describe(value)}")
        return tuple(_convert(args[0], v, (*path, i), None, ctx) for i, v in enumerate(value))
    if origin is Mapping:
        if not isinstance(value, Mapping):
            raise ctx.error(path, f"expected a mapping, got {_describe(value)}")
        out: dict[str, Any] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ctx.error(path, f"keys must be strings, got {_describe(k)}")
            out[k] = _convert(args[1], v, (*path, k), None, ctx)
        return out
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _parse_dataclass(tp, value, path, base, ctx)
    return _convert_scalar(tp, value, path, ctx)


def parse_infra(data: Any, *, origin: Origin | None = None, label: str = "infra") -> InfraConfig:
    """Build the typed :class:`InfraConfig` from a resolved mapping, strictly."""
    return _parse_dataclass(InfraConfig, data, (), None, _Ctx(label=label, origin=origin))


def allowed_keys(cls: type) -> list[str]:
    """The keys a block accepts (for help texts and errors)."""
    return sorted(f.name for f in dataclasses.fields(cls))
