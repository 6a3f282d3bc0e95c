"""The field types of the infra schema and the base of its blocks (pydantic, strict).

Strict validation with the few conversions a YAML file needs, each explicit:

* ``Str``: a string; an integer becomes its text (``queue: 1``); floats and booleans are
  refused, YAML would mangle them (``2.50`` -> ``2.5``; quote them);
* ``Qty`` (a Kubernetes quantity): a non-empty string, or a number;
* enums (``as_enum``): the enum's value (``kind: kai``);
* tuples (``as_tuple``): a YAML list (a list becomes a tuple, so the models stay immutable);
* ``IntOrStr``: an integer or a string (``maxUnavailable: 1`` or ``"25%"``).

A conversion that fails raises ``ValueError`` with nymph's message, which
:mod:`nymph.dockyard.spec.parse` reports with the key path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Annotated, Any, ClassVar, NewType, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, model_validator

#: A Kubernetes resource quantity (``"500m"``, ``"2Gi"``); YAML numbers are accepted.
Quantity = NewType("Quantity", str)

Problems = list[tuple[str, str]]
E = TypeVar("E", bound=StrEnum)


def describe(value: Any) -> str:
    """A value as an error message names it: ``string 'x'``, ``number 2.5``, ``a list``."""
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


def _as_str(value: Any) -> Any:
    if value is None or isinstance(value, str):
        return value  # null: the strict schema says whether it may be
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise ValueError(f"expected a string, got {describe(value)} (quote it)")


def _as_quantity(value: Any) -> Any:
    if value is None:
        return value
    if isinstance(value, str) and value.strip():
        return value.strip()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(int(value)) if float(value).is_integer() else repr(value)
    raise ValueError(f"expected a quantity ('500m', '2Gi', 4), got {describe(value)}")


def as_tuple(value: Any) -> Any:
    if value is None or isinstance(value, tuple):
        return value
    if isinstance(value, list):
        return tuple(value)
    raise ValueError(f"expected a list, got {describe(value)}")


def _as_int_or_str(value: Any) -> Any:
    if value is None or isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise ValueError(f"expected int or str, got {describe(value)}")


def as_enum(cls: type[E]) -> Callable[[Any], Any]:
    allowed = [m.value for m in cls]

    def convert(value: Any) -> Any:
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, str) and value in allowed:
            return cls(value)
        raise ValueError(f"{describe(value)} is not allowed (allowed: {', '.join(allowed)})")

    return convert


Str = Annotated[str, BeforeValidator(_as_str)]
Qty = Annotated[Quantity, BeforeValidator(_as_quantity)]
IntOrStr = Annotated[int | str, BeforeValidator(_as_int_or_str)]
StrMap = Mapping[str, Str]
QtyMap = Mapping[str, Qty]
StrTuple = Annotated[tuple[Str, ...], BeforeValidator(as_tuple)]


class Block(BaseModel):
    """A block of the infra: frozen, strict, no unknown keys.

    A nested block given partially is laid over the field's default (see the schema
    docstring); ``exclusive`` names keys of which setting one drops the default of the
    others, ``replace_whole`` the nested blocks that replace their default as a whole.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    exclusive: ClassVar[tuple[str, ...]] = ()
    replace_whole: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="before")
    @classmethod
    def _over_field_defaults(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        out = dict(data)
        for name, info in cls.model_fields.items():
            given = out.get(name)
            if name in cls.replace_whole or not isinstance(given, Mapping):
                continue
            default = info.get_default(call_default_factory=True)
            if not isinstance(default, Block):
                continue
            drop = default.exclusive if any(k in given for k in default.exclusive) else ()
            base = {k: getattr(default, k) for k in type(default).model_fields if k not in drop}
            out[name] = {**base, **given}
        return out

    def problems(self) -> Problems:
        """Cross-field rules: (key relative to this block, message)."""
        return []
