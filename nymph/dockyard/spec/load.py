"""Load a recipe and its infra spec into a :class:`LoadedConfig`.

Infra layers, low to high:

1. shipped defaults (``nymph/dockyard/spec/defaults.yaml``);
2. user defaults (``$DOCKYARD_K8S_DEFAULTS``, else ``~/.config/dockyard-k8s/defaults.yaml``
   when it exists);
3. the infra file (``--infra``) or the recipe's ``infra:`` block (not both);
4. command-line overrides under ``infra.`` (other overrides go to the recipe).

Default and infra files may hold the infra body directly or under a top-level ``infra:``
key. Top-level keys that start with ``_`` in infra layers (``_anchors:``) are scratch space
for YAML anchors and are dropped, as dockyard-k8s does; ``_anchors`` is dropped from the
recipe too. Recipes and infra files may inherit with ``defaults: base.yaml`` (or a list),
relative to the file.

Layers merge with OmegaConf (:mod:`nymph.dockyard.spec.layers`), overrides apply with
OmegaConf (:mod:`nymph.dockyard.spec.overrides`), then interpolations are resolved by
OmegaConf (:mod:`nymph.dockyard.spec.interp`; infra strictly, with references falling back
to the recipe; the recipe leniently), the namespace is inferred
when unset (:mod:`nymph.dockyard.spec.kubecontext`) and the infra is parsed strictly
with pydantic (:mod:`nymph.dockyard.spec.parse`). All I/O is reading files; paths and the environment come in
through :class:`Environment`, so tests inject them.
"""

from __future__ import annotations

import copy
import getpass
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nymph.dockyard.errors import DockyardConfigError
from nymph.dockyard.spec import kubecontext
from nymph.dockyard.spec.interp import InterpolationContext, resolve
from nymph.dockyard.spec.keypath import KeyPath
from nymph.dockyard.spec.layers import Provenance, merge
from nymph.dockyard.spec.overrides import Override, apply_override, parse_overrides
from nymph.dockyard.spec.parse import parse_infra
from nymph.dockyard.spec.schema import InfraConfig
from nymph.dockyard.spec.yamlio import load_file

DEFAULTS_ENV = "DOCKYARD_K8S_DEFAULTS"
USER_ENV = "DOCKYARD_K8S_USER"
SHIPPED_DEFAULTS = Path(__file__).with_name("defaults.yaml")
RECIPE_SCRATCH_KEY = "_anchors"
_NOT_LABEL = re.compile(r"[^a-z0-9-]+")


def sanitize_user(raw: str) -> str:
    """A user name fit for a label value / resource name: ``Jo_Smith`` -> ``jo-smith``."""
    name = _NOT_LABEL.sub("-", raw.lower().replace("_", "-").replace(".", "-")).strip("-")
    return name[:63].rstrip("-") or "unknown"


def _process_user(env: Mapping[str, str]) -> str:
    raw = env.get(USER_ENV)
    if not raw:
        try:
            raw = getpass.getuser()
        except (OSError, KeyError):
            raw = "unknown"
    return sanitize_user(raw)


@dataclass(frozen=True, kw_only=True)
class Environment:
    """Everything the loader reads besides the recipe and infra files."""

    env: Mapping[str, str] = field(default_factory=dict)
    home: Path = Path("/nonexistent")
    user: str = "unknown"
    kubeconfigs: tuple[Path, ...] | None = None  # None: from KUBECONFIG / ~/.kube/config
    context: str | None = None  # None: the current context
    sa_namespace_path: Path = kubecontext.SA_NAMESPACE_PATH
    shipped_defaults: Path = SHIPPED_DEFAULTS

    @classmethod
    def from_process(cls) -> Environment:
        env = dict(os.environ)
        return cls(env=env, home=Path.home(), user=_process_user(env))

    def user_defaults(self) -> tuple[Path, bool]:
        """The user-defaults path and whether it was named explicitly (must then exist)."""
        explicit = self.env.get(DEFAULTS_ENV)
        if explicit:
            return Path(explicit).expanduser(), True
        return self.home / ".config" / "dockyard-k8s" / "defaults.yaml", False

    def kubeconfig_paths(self) -> list[Path]:
        if self.kubeconfigs is not None:
            return list(self.kubeconfigs)
        return kubecontext.kubeconfig_paths(env=self.env, home=self.home)


@dataclass(frozen=True, kw_only=True)
class LoadedConfig:
    recipe_path: Path
    infra_path: Path | None
    recipe: Mapping[str, Any]
    infra: InfraConfig
    #: where the infra layer came from (the infra file, or ``RECIPE (infra:)``)
    infra_source: str
    #: where the namespace came from (``infra``, ``kube context 'x' (...)``, ...)
    namespace_source: str


def _mapping(doc: Any, *, source: str) -> dict[str, Any]:
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise DockyardConfigError("expected a mapping at the top level", source=source)
    for key in doc:
        if not isinstance(key, str):
            raise DockyardConfigError(f"top-level keys must be strings, got {key!r}", source=source)
    return doc


def _load_inheriting(path: Path, *, chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """One YAML file with its ``defaults:`` chain merged underneath."""
    path = path.resolve()
    if path in chain:
        cycle = " -> ".join(str(p) for p in (*chain, path))
        raise DockyardConfigError(f"defaults: inheritance cycle {cycle}", source=str(path))
    doc = _mapping(load_file(path), source=str(path))
    parents = doc.pop("defaults", None)
    if parents is None:
        return doc
    if isinstance(parents, str):
        parents = [parents]
    if not isinstance(parents, list) or not all(isinstance(p, str) and p for p in parents):
        raise DockyardConfigError(
            "expected a file path or a list of file paths (relative to this file)",
            path="defaults",
            source=str(path),
        )
    base: dict[str, Any] = {}
    scratch = Provenance()
    for rel in parents:
        parent = _load_inheriting(path.parent / rel, chain=(*chain, path))
        base = merge(base, parent, source=rel, provenance=scratch)
    merged: dict[str, Any] = merge(base, doc, source=str(path), provenance=scratch)
    return merged


def _drop_scratch(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if not k.startswith("_")}


def _infra_body(doc: dict[str, Any], *, source: str) -> dict[str, Any]:
    """A defaults / infra file holds the body directly or under ``infra:``."""
    doc = _drop_scratch(doc)
    if "infra" not in doc:
        return doc
    others = sorted(k for k in doc if k != "infra")
    if others:
        raise DockyardConfigError(
            f"unexpected top-level keys next to infra: {', '.join(others)} "
            "(a file holds the infra body, or only an infra: block)",
            source=source,
        )
    return _drop_scratch(_mapping(doc["infra"], source=f"{source} (infra:)"))


def _user_defaults(environment: Environment) -> tuple[dict[str, Any], str] | None:
    path, explicit = environment.user_defaults()
    if not path.exists():
        if explicit:
            raise DockyardConfigError(f"no such file (named by ${DEFAULTS_ENV})", source=str(path))
        return None
    return _infra_body(_load_inheriting(path), source=str(path)), str(path)


def _split_overrides(overrides: Sequence[str]) -> tuple[list[Override], list[Override]]:
    parsed = parse_overrides(overrides)
    return (
        [o for o in parsed if o.target == "recipe"],
        [o for o in parsed if o.target == "infra"],
    )


def load_config(
    *,
    recipe_path: Path,
    infra_path: Path | None = None,
    overrides: Sequence[str] = (),
    environment: Environment | None = None,
) -> LoadedConfig:
    """Read, merge, resolve and validate a recipe + infra pair (see the module docstring)."""
    recipe = _load_inheriting(recipe_path)
    recipe.pop(RECIPE_SCRATCH_KEY, None)
    recipe_infra = recipe.pop("infra", None)

    if infra_path is not None:
        if recipe_infra is not None:
            raise DockyardConfigError(
                f"the recipe has an infra: block and --infra {infra_path} was given; use one",
                path="infra",
                source=str(recipe_path),
            )
        infra_source = str(infra_path)
        infra_layer = _infra_body(_load_inheriting(infra_path), source=infra_source)
    else:
        infra_source = f"{recipe_path} (infra:)"
        infra_layer = _drop_scratch(_mapping(recipe_infra, source=infra_source))
    return _resolve(
        recipe=recipe,
        infra_layer=infra_layer,
        infra_source=infra_source,
        recipe_path=recipe_path,
        infra_path=infra_path,
        overrides=overrides,
        environment=environment or Environment.from_process(),
    )


def load_mappings(
    *,
    recipe: Mapping[str, Any],
    infra: Mapping[str, Any] | None,
    overrides: Sequence[str] = (),
    environment: Environment,
    source: str = "task",
) -> LoadedConfig:
    """:func:`load_config` for a recipe and infra already in memory (no file is read but the
    layers of ``environment``). ``infra`` may be ``None`` when the recipe carries an
    ``infra:`` block; ``defaults:`` inheritance needs files and is not followed."""
    recipe_doc = _mapping(copy.deepcopy(dict(recipe)), source=f"{source} recipe")
    recipe_doc.pop(RECIPE_SCRATCH_KEY, None)
    recipe_infra = recipe_doc.pop("infra", None)
    if infra is not None:
        if recipe_infra is not None:
            raise DockyardConfigError(
                "the recipe has an infra: block and an infra spec was given; use one",
                path="infra",
                source=f"{source} recipe",
            )
        infra_source = f"{source} infra"
        infra_layer = _infra_body(
            _mapping(copy.deepcopy(dict(infra)), source=infra_source), source=infra_source
        )
    else:
        infra_source = f"{source} recipe (infra:)"
        infra_layer = _drop_scratch(_mapping(copy.deepcopy(recipe_infra), source=infra_source))
    return _resolve(
        recipe=recipe_doc,
        infra_layer=infra_layer,
        infra_source=infra_source,
        recipe_path=Path(f"<{source} recipe>"),
        infra_path=None,
        overrides=overrides,
        environment=environment,
    )


def _resolve(
    *,
    recipe: dict[str, Any],
    infra_layer: dict[str, Any],
    infra_source: str,
    recipe_path: Path,
    infra_path: Path | None,
    overrides: Sequence[str],
    environment: Environment,
) -> LoadedConfig:
    recipe_overrides, infra_overrides = _split_overrides(overrides)
    provenance = Provenance(root=infra_source)
    shipped = environment.shipped_defaults
    infra = _infra_body(_load_inheriting(shipped), source=str(shipped))
    provenance.record_layer(infra, source=str(shipped))
    user = _user_defaults(environment)
    if user is not None:
        infra = merge(infra, user[0], source=user[1], provenance=provenance)
    infra = merge(infra, infra_layer, source=infra_source, provenance=provenance)
    for override in infra_overrides:
        apply_override(infra, override)
        provenance.record(override.path, override.source)
    for override in recipe_overrides:
        apply_override(recipe, override)

    def origin(path: KeyPath) -> str | None:
        # a value left as the shipped default (``launch.entrypoint: null``) is the user's to
        # set: report it against their infra, not against nymph's defaults file
        source = provenance.lookup(path)
        return infra_source if source == str(shipped) else source

    ctx = InterpolationContext(user=environment.user, env=environment.env)
    resolved_recipe = resolve(recipe, ctx=ctx, strict=False)
    resolved_infra = resolve(
        infra, ctx=ctx, strict=True, label="infra", fallback=resolved_recipe, origin=origin
    )

    namespace_source = "infra"
    if resolved_infra.get("namespace") in (None, ""):
        choice = kubecontext.infer_namespace(
            kubeconfigs=environment.kubeconfig_paths(),
            sa_namespace_path=environment.sa_namespace_path,
            context=environment.context,
        )
        resolved_infra["namespace"] = choice.namespace
        namespace_source = choice.source
        provenance.record(("namespace",), f"namespace inferred from {choice.source}")

    return LoadedConfig(
        recipe_path=recipe_path,
        infra_path=infra_path,
        recipe=resolved_recipe,
        infra=parse_infra(resolved_infra, origin=origin),
        infra_source=infra_source,
        namespace_source=namespace_source,
    )
