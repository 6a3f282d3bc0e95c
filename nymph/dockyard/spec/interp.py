"""``${...}`` interpolations, resolved by OmegaConf with dockyard-k8s's resolvers.

Inside any string value (OmegaConf's grammar):

* ``${user:}`` — the current user name (lower-cased, ``_`` and ``.`` turned into ``-`` so it
  fits a label value);
* ``${oc.env:VAR}`` and ``${oc.env:VAR,default}`` — an environment variable (always a
  string; a ``null`` default gives ``null``); defaults may themselves interpolate;
* ``${path.to.key}`` (absolute, from the root) and ``${.sibling}`` / ``${..uncle}``
  (relative);
* ``\\${`` for a literal ``${``.

A string that is exactly one interpolation takes the referenced value's type
(``port: ${sandbox.port}`` stays an int). Strict mode (the infra) turns every unresolvable
expression into nymph's error naming the key path and the file; lenient mode (the recipe,
which the training code loads with its own resolvers) keeps an unresolvable value verbatim.
``fallback`` (the resolved recipe) answers absolute references the tree itself lacks.

The user and the environment come from :class:`InterpolationContext`, never from the process,
while a resolution runs. OmegaConf is imported on first use.
"""

from __future__ import annotations

import contextvars
import os
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nymph.dockyard.errors import DockyardBudgetError, DockyardConfigError
from nymph.dockyard.spec import budget
from nymph.dockyard.spec.keypath import KeyPath, fmt

if TYPE_CHECKING:
    from omegaconf import DictConfig, ListConfig

RESOLVERS = ("user", "oc.env")
_SIMPLE_REF = re.compile(r"\$\{\s*(\.*[A-Za-z0-9_\-]+(?:\.[A-Za-z0-9_\-]+|\[\d+\])*)\s*\}")
_NOT_FOUND = re.compile(r"Interpolation key '([^']*)' not found")
_UNSUPPORTED = re.compile(r"Unsupported interpolation type (\S+)")


@dataclass(frozen=True, kw_only=True)
class InterpolationContext:
    user: str
    env: Mapping[str, str]


_CONTEXT: contextvars.ContextVar[InterpolationContext | None] = contextvars.ContextVar(
    "dockyard_interpolation", default=None
)
_FAILURE: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "dockyard_resolver_failure", default=None
)
_MISSING = object()


class _ResolverFailure(Exception):
    pass


def _fail_resolver(message: str) -> _ResolverFailure:
    _FAILURE.set(message)
    return _ResolverFailure(message)


def _user() -> str:
    ctx = _CONTEXT.get()
    if ctx is not None:
        return ctx.user
    from nymph.dockyard.spec.load import sanitize_user

    return sanitize_user(os.environ.get("USER", "unknown"))


def _env(var: Any = _MISSING, default: Any = _MISSING) -> str | None:
    if not isinstance(var, str) or not var:
        raise _fail_resolver("${oc.env:...} needs a variable name")
    ctx = _CONTEXT.get()
    env = ctx.env if ctx is not None else os.environ
    if var in env:
        return env[var]
    if default is not _MISSING:
        return None if default is None else str(default)
    raise _fail_resolver(f"environment variable {var} is not set (give a default: ${{oc.env:{var},VALUE}})")


def _charge_steps() -> None:
    """Make every interpolation OmegaConf evaluates one step of the running render's budget
    (:mod:`nymph.dockyard.spec.budget`); a no-op outside :func:`budget.limited`. Installed once,
    on ``Container.resolve_parse_tree``, the one method every ``${...}`` goes through."""
    from omegaconf.base import Container

    original = Container.resolve_parse_tree
    if getattr(original, "_nymph_budget", False):
        return

    def resolve_parse_tree(self: Any, *args: Any, **kwargs: Any) -> Any:
        spend = budget.current()
        if spend is None:
            return original(self, *args, **kwargs)
        spend.step()
        node: Any = kwargs["node"] if "node" in kwargs else args[1] if len(args) > 1 else None
        spend.text(getattr(node, "_value", lambda: None)())
        value = original(self, *args, **kwargs)
        spend.text(value)
        return value

    resolve_parse_tree._nymph_budget = True  # type: ignore[attr-defined]
    Container.resolve_parse_tree = resolve_parse_tree  # type: ignore[method-assign]


def register_resolvers() -> None:
    """dockyard-k8s's resolvers (``user``; ``oc.env`` reading the injected environment)."""
    from omegaconf import OmegaConf

    OmegaConf.register_resolver("user", _user, replace=True, annotation_validation="off")
    OmegaConf.register_resolver("oc.env", _env, replace=True, annotation_validation="off")
    _charge_steps()


@contextmanager
def context(ctx: InterpolationContext) -> Iterator[None]:
    register_resolvers()
    token = _CONTEXT.set(ctx)
    try:
        yield
    finally:
        _CONTEXT.reset(token)


def escape(value: Any) -> Any:
    """A resolved value made safe to put back into an OmegaConf tree (``${`` kept literal)."""
    if isinstance(value, str):
        return value.replace("${", "\\${")
    if isinstance(value, Mapping):
        return {k: escape(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [escape(v) for v in value]
    return value


def _malformed(tree: Any, *, strict: bool, path: KeyPath, fail: Callable[[KeyPath, str], Exception]) -> Any:
    """Strings OmegaConf's grammar refuses: an error (strict) or kept literal (lenient)."""
    from omegaconf import grammar_parser
    from omegaconf.errors import GrammarParseError

    if isinstance(tree, Mapping):
        return {k: _malformed(v, strict=strict, path=(*path, k), fail=fail) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_malformed(v, strict=strict, path=(*path, i), fail=fail) for i, v in enumerate(tree)]
    if isinstance(tree, str) and "${" in tree:
        spend = budget.current()
        if spend is not None:
            spend.text(tree)
        try:
            grammar_parser.parse(tree)
        except GrammarParseError:
            if strict:
                raise fail(path, f"malformed interpolation {tree!r}") from None
            return tree.replace("${", "\\${")
    return tree


class _Resolution:
    def __init__(self, root: DictConfig, *, strict: bool, fail: Callable[[KeyPath, str], Exception]):
        self.root = root
        self.strict = strict
        self.fail = fail

    def node(self, cfg: DictConfig | ListConfig, path: KeyPath) -> Any:
        from omegaconf import DictConfig

        if isinstance(cfg, DictConfig):
            return {k: self.leaf(cfg, k, (*path, str(k))) for k in cfg.keys()}  # noqa: SIM118
        return [self.leaf(cfg, i, (*path, i)) for i in range(len(cfg))]

    def leaf(self, parent: DictConfig | ListConfig, key: Any, path: KeyPath) -> Any:
        from omegaconf import DictConfig, ListConfig, OmegaConf
        from omegaconf.errors import OmegaConfBaseException

        raw = parent._get_node(key)._value()  # type: ignore[union-attr]
        _FAILURE.set(None)
        try:
            value = parent[key]
        except (OmegaConfBaseException, RecursionError) as exc:
            if not self.strict:
                return raw
            raise self.fail(path, self._message(exc, raw, path)) from None
        if isinstance(value, DictConfig | ListConfig):
            return self.node(value, path)
        if isinstance(raw, str) and OmegaConf.is_interpolation(parent, key):
            self._check_embedded(raw, path)
        return value

    def _check_embedded(self, raw: str, path: KeyPath) -> None:
        """A mapping or list referenced inside a longer string is an error."""
        from omegaconf import DictConfig, ListConfig, OmegaConf

        refs = list(_SIMPLE_REF.finditer(raw))
        if len(refs) == 1 and refs[0].group(0) == raw.strip():
            return
        for ref in refs:
            text = ref.group(1)
            dots = len(text) - len(text.lstrip("."))
            if dots:
                base = path[: len(path) - dots]
                text = ".".join([*(str(p) for p in base), text[dots:]]) if base else text[dots:]
            found = OmegaConf.select(self.root, text, default=None, throw_on_resolution_failure=False)
            if isinstance(found, DictConfig | ListConfig):
                message = f"${{{ref.group(1)}}} is a mapping or list and cannot be part of a string"
                raise self.fail(path, message)

    def _message(self, exc: BaseException, raw: Any, path: KeyPath) -> str:
        failure = _FAILURE.get()
        if failure is not None:
            return failure
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if isinstance(exc, RecursionError) or "Recursive interpolation" in text:
            return f"circular interpolation at {fmt(path)} ({raw!r})"
        found = _NOT_FOUND.search(text)
        if found:
            return f"reference ${{{found.group(1)}}}: no key {found.group(1).lstrip('.')} in {self._label}"
        unsupported = _UNSUPPORTED.search(text)
        if unsupported:
            return (
                f"unknown resolver {unsupported.group(1)!r} in {raw!r} "
                f"(supported: {', '.join(RESOLVERS)} and ${{path.to.key}} references)"
            )
        return f"cannot resolve {raw!r}: {text}"

    _label = "the tree"


def resolve(
    tree: Mapping[str, Any],
    *,
    ctx: InterpolationContext,
    strict: bool = True,
    label: str = "",
    fallback: Mapping[str, Any] | None = None,
    origin: Callable[[KeyPath], str | None] | None = None,
) -> dict[str, Any]:
    """Resolve every interpolation in ``tree`` (see the module docstring)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    def fail(at: KeyPath, message: str) -> DockyardConfigError:
        full: KeyPath = ((label,) if label else ()) + at
        return DockyardConfigError(message, path=fmt(full), source=origin(at) if origin else None)

    try:
        own = _malformed(dict(tree), strict=strict, path=(), fail=fail)
    except budget.BudgetSpent as spent:
        raise DockyardBudgetError(str(spent), path=label or None) from None
    extra = {k: escape(v) for k, v in (fallback or {}).items() if k not in own}
    try:
        root = OmegaConf.create({**extra, **own})
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None)
        raise fail(tuple(str(key).split(".")) if key else (), str(exc).splitlines()[0]) from None
    resolution = _Resolution(root, strict=strict, fail=fail)
    resolution._label = label or "the tree"
    with context(ctx):
        try:
            resolved = {k: resolution.leaf(root, k, (k,)) for k in own}
        except budget.BudgetSpent as spent:
            raise DockyardBudgetError(str(spent), path=label or None) from None
    spend = budget.current()
    if spend is not None and spend.spent is not None:  # spent where an error was kept lenient
        raise DockyardBudgetError(spend.spent, path=label or None)
    return resolved
