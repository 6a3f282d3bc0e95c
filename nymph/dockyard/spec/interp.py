"""OmegaConf-style interpolations, resolved without OmegaConf.

Supported inside any string value:

* ``${user:}`` — the current user name (lower-cased, ``_`` and ``.`` turned into ``-`` so it
  fits a label value);
* ``${oc.env:VAR}`` and ``${oc.env:VAR,default}`` — an environment variable (always a
  string; a ``null`` default gives ``null``); defaults may themselves interpolate;
* ``${path.to.key}`` (absolute, from the root; ``a.b[0].c`` and ``a.b.0.c`` both index
  lists) and ``${.sibling}`` / ``${..uncle}`` (relative, OmegaConf style);
* ``\\${`` for a literal ``${``.

A string that is exactly one interpolation takes the referenced value's type
(``port: ${sandbox.port}`` stays an int); interpolations inside longer strings are
converted to text. References are resolved recursively with cycle detection.

Strict mode (the infra) turns every unresolvable expression into an error naming the key
path. Lenient mode (the recipe, which the training code loads with its own resolvers)
keeps unknown resolvers and missing references verbatim.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from nymph.dockyard.errors import DockyardConfigError
from nymph.dockyard.spec.keypath import KeyPath, fmt

RESOLVERS = ("user", "oc.env")
_RESOLVER_NAME = re.compile(r"^[A-Za-z_][\w.]*$")
_INDEX = re.compile(r"\[(\d+)\]")


@dataclass(frozen=True, kw_only=True)
class InterpolationContext:
    user: str
    env: Mapping[str, str]


class _Unresolvable(Exception):
    """Internal: an expression that lenient mode keeps verbatim."""


@dataclass(frozen=True)
class _Expr:
    inner: str


def _split(text: str) -> list[str | _Expr]:
    """Literal text and ``${...}`` expressions (nested ``${`` counted)."""
    out: list[str | _Expr] = []
    buf: list[str] = []
    i, n = 0, len(text)
    while i < n:
        if text.startswith("\\${", i):
            buf.append("${")
            i += 3
        elif text.startswith("${", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("${", j):
                    depth += 1
                    j += 2
                    continue
                if text[j] == "}":
                    depth -= 1
                j += 1
            if depth:
                raise _Unresolvable(f"unterminated interpolation {text[i:]!r}")
            if buf:
                out.append("".join(buf))
                buf = []
            out.append(_Expr(text[i + 2 : j - 1]))
            i = j
        else:
            buf.append(text[i])
            i += 1
    if buf:
        out.append("".join(buf))
    return out


def _top_level_split(text: str, sep: str) -> list[str]:
    """Split on ``sep`` outside nested ``${...}``."""
    parts: list[str] = []
    depth, start, i = 0, 0, 0
    while i < len(text):
        if text.startswith("${", i):
            depth += 1
            i += 2
            continue
        ch = text[i]
        if ch == "}" and depth:
            depth -= 1
        elif ch == sep and not depth:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    parts.append(text[start:])
    return parts


def _has_interpolation(value: str) -> bool:
    return "${" in value


class Resolver:
    """Resolves every interpolation in one tree (``root``).

    ``label`` prefixes key paths in errors (``infra``); ``fallback`` is consulted for
    absolute references that are not found in this tree; ``origin`` maps a key path to the
    file the value came from.
    """

    def __init__(
        self,
        root: Any,
        *,
        ctx: InterpolationContext,
        strict: bool,
        label: str = "",
        fallback: Resolver | None = None,
        origin: Callable[[KeyPath], str | None] | None = None,
    ) -> None:
        self._root = root
        self._ctx = ctx
        self._strict = strict
        self._label = label
        self._fallback = fallback
        self._origin = origin
        self._cache: dict[KeyPath, Any] = {}
        self._stack: list[KeyPath] = []

    # -- public -------------------------------------------------------------------------

    def resolve_all(self) -> Any:
        return self._resolved(())

    def lookup(self, path: KeyPath) -> Any:
        """The resolved value at an absolute path; raises ``KeyError`` when absent."""
        self._raw(path)  # KeyError when absent
        return self._resolved(path)

    # -- internals ----------------------------------------------------------------------

    def _fail(self, at: KeyPath, message: str) -> DockyardConfigError:
        full: KeyPath = ((self._label,) if self._label else ()) + at
        source = self._origin(at) if self._origin else None
        return DockyardConfigError(message, path=fmt(full), source=source)

    def _raw(self, path: KeyPath) -> Any:
        node = self._root
        for part in path:
            if isinstance(node, Mapping):
                key: Any = part if part in node else str(part)
                if key not in node:
                    raise KeyError(part)
                node = node[key]
            elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
                node = node[part]
            else:
                raise KeyError(part)
        return node

    def _resolved(self, path: KeyPath) -> Any:
        if path in self._cache:
            return self._cache[path]
        if path in self._stack:
            cycle = " -> ".join(fmt(p) for p in [*self._stack[self._stack.index(path) :], path])
            raise self._fail(path, f"circular interpolation: {cycle}")
        self._stack.append(path)
        try:
            raw = self._raw(path)
            value: Any
            if isinstance(raw, Mapping):
                value = {k: self._resolved((*path, k)) for k in raw}
            elif isinstance(raw, list):
                value = [self._resolved((*path, i)) for i in range(len(raw))]
            elif isinstance(raw, str) and _has_interpolation(raw):
                value = self._interpolate(raw, at=path)
            else:
                value = raw
        finally:
            self._stack.pop()
        self._cache[path] = value
        return value

    def _interpolate(self, text: str, *, at: KeyPath) -> Any:
        try:
            segments = _split(text)
        except _Unresolvable as exc:
            if self._strict:
                raise self._fail(at, str(exc)) from None
            return text
        if len(segments) == 1 and isinstance(segments[0], _Expr):
            return self._eval_or_keep(segments[0], at=at)
        out: list[str] = []
        for seg in segments:
            if isinstance(seg, str):
                out.append(seg)
                continue
            value = self._eval_or_keep(seg, at=at)
            if isinstance(value, Mapping | list):
                raise self._fail(at, f"${{{seg.inner}}} is a mapping or list and cannot be part of a string")
            out.append(str(value))
        return "".join(out)

    def _eval_or_keep(self, expr: _Expr, *, at: KeyPath) -> Any:
        try:
            return self._eval(expr.inner, at=at)
        except _Unresolvable as exc:
            if self._strict:
                raise self._fail(at, str(exc)) from None
            return "${" + expr.inner + "}"

    def _eval(self, inner: str, *, at: KeyPath) -> Any:
        head = _top_level_split(inner, ":")
        if len(head) > 1:
            name = head[0].strip()
            args_text = inner[len(head[0]) + 1 :]
            if not _RESOLVER_NAME.match(name):
                raise _Unresolvable(f"malformed interpolation ${{{inner}}}")
            return self._call(name, args_text, at=at)
        return self._reference(inner.strip(), at=at)

    def _arg(self, text: str, *, at: KeyPath) -> Any:
        text = text.strip()
        if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
            return text[1:-1]
        if text == "null":
            return None
        if _has_interpolation(text):
            return self._interpolate(text, at=at)
        return text

    def _call(self, name: str, args_text: str, *, at: KeyPath) -> Any:
        raw_args = _top_level_split(args_text, ",") if args_text.strip() else []
        if name == "user":
            if raw_args:
                raise _Unresolvable("${user:} takes no arguments")
            return self._ctx.user
        if name == "oc.env":
            if not 1 <= len(raw_args) <= 2:
                raise _Unresolvable("${oc.env:VAR} or ${oc.env:VAR,default} expected")
            var = self._arg(raw_args[0], at=at)
            if not isinstance(var, str) or not var:
                raise _Unresolvable("${oc.env:...} needs a variable name")
            if var in self._ctx.env:
                return self._ctx.env[var]
            if len(raw_args) == 2:
                default = self._arg(raw_args[1], at=at)
                return None if default is None else str(default)
            raise _Unresolvable(
                f"environment variable {var} is not set (give a default: ${{oc.env:{var},VALUE}})"
            )
        raise _Unresolvable(
            f"unknown resolver {name!r} in ${{{name}:{args_text}}} "
            f"(supported: {', '.join(RESOLVERS)} and ${{path.to.key}} references)"
        )

    def _reference(self, ref: str, *, at: KeyPath) -> Any:
        if not ref:
            raise _Unresolvable("empty interpolation ${}")
        dots = len(ref) - len(ref.lstrip("."))
        body = _INDEX.sub(r".\1", ref[dots:])
        parts: list[str | int] = [int(p) if p.isdigit() else p for p in body.split(".") if p != ""]
        if dots:
            up = dots - 1
            base = at[:-1]
            if up > len(base):
                raise _Unresolvable(f"reference ${{{ref}}} climbs above the root")
            target: KeyPath = (*base[: len(base) - up], *parts)
        else:
            target = tuple(parts)
        try:
            self._raw(target)
        except KeyError:
            if not dots and self._fallback is not None:
                try:
                    return self._fallback.lookup(target)
                except KeyError:
                    pass
            where = f" in {self._label}" if self._label else ""
            raise _Unresolvable(f"reference ${{{ref}}}: no key {fmt(target)}{where}") from None
        return self._resolved(target)


def resolve(
    tree: Any,
    *,
    ctx: InterpolationContext,
    strict: bool = True,
    label: str = "",
    fallback: Resolver | None = None,
    origin: Callable[[KeyPath], str | None] | None = None,
) -> Any:
    """Resolve every interpolation in ``tree`` (see the module docstring)."""
    return Resolver(tree, ctx=ctx, strict=strict, label=label, fallback=fallback, origin=origin).resolve_all()
