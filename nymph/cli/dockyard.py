"""``nymph dockyard``: ``render`` and ``check`` need no cluster (``render --dry-run`` asks the API
server); the live verbs (``run``, ``cluster``, ``status``, ``logs``, ``job``, ``dev``, ``doctor``)
are wired in :mod:`nymph.cli.dockyard_live` (``job``: :mod:`nymph.cli.dockyard_jobs`; ``dev``
and ``cluster dashboard``: :mod:`nymph.cli.dockyard_dev`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nymph.cli import dockyard_live
from nymph.dockyard.errors import DockyardConfigError
from nymph.errors import ConfigError

# The spec models and the renderer load when a verb runs, not to build the parser.
if TYPE_CHECKING:
    from nymph.dockyard.render import k8s
    from nymph.dockyard.spec.load import Environment, LoadedConfig


class _IntermixedParser(argparse.ArgumentParser):
    """Lets overrides and options mix: ``render R.yaml --infra F a=b c=d``."""

    _inner = False

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if self._inner or self._subparsers is not None:  # intermixed parsing cannot nest verbs
            return super().parse_known_args(args, namespace)
        self._inner = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._inner = False


def _load(
    args: argparse.Namespace, *, extra_overrides: Sequence[str] = (), environment: Environment | None = None
) -> tuple[LoadedConfig, list[k8s.Manifest]]:
    from nymph.dockyard.render.manifests import render_manifests
    from nymph.dockyard.spec.load import load_config

    try:
        loaded = load_config(
            recipe_path=Path(args.recipe),
            infra_path=Path(args.infra) if args.infra else None,
            overrides=[*args.overrides, *extra_overrides],
            environment=environment,
        )
    except DockyardConfigError as exc:
        if args.infra or not (exc.path or "").startswith("infra") or not _looks_like_infra(Path(args.recipe)):
            raise
        raise DockyardConfigError(
            f"{exc.message} ({args.recipe} looks like an infra spec, not a recipe: give the recipe "
            f"first and this file with --infra {args.recipe})",
            path=exc.path,
            source=exc.source,
        ) from None
    try:
        manifests = render_manifests(infra=loaded.infra)
    except DockyardConfigError as exc:
        if exc.source is not None:
            raise
        raise DockyardConfigError(exc.message, path=exc.path, source=loaded.infra_source) from None
    return loaded, manifests


def _looks_like_infra(path: Path) -> bool:
    """Whether a file given as the recipe is an infra spec instead: no ``infra:`` block, and
    top-level keys that are the infra spec's own."""
    import yaml

    from nymph.dockyard.spec.schema import InfraConfig

    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    if not isinstance(doc, dict) or "infra" in doc:
        return False
    return bool(set(doc) & set(InfraConfig.model_fields))


def cmd_render(args: argparse.Namespace) -> int:
    if args.dry_run:
        return dockyard_live.render_dry_run(args, load=_load)
    from nymph.dockyard.render.manifests import to_yaml

    _, manifests = _load(args)
    sys.stdout.write(to_yaml(manifests))
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from nymph.dockyard.render import summary

    loaded, manifests = _load(args)
    if args.output is None:
        sys.stdout.write(summary.summary(loaded, manifests))
        return 0
    out = Path(args.output)
    text = summary.bundle_text(summary.bundle(loaded, manifests), json_format=out.suffix == ".json")
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"-o {out}: cannot write ({exc.__class__.__name__})") from None
    print(f"wrote the resolved bundle ({len(manifests)} manifests) to {out}")
    return 0


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe", help="recipe YAML (may carry an infra: block)")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="Hydra-style overrides: infra.scheduler.queue=team-a targets the infra spec, "
        "other keys the recipe; ~KEY deletes",
    )
    p.add_argument("--infra", metavar="FILE", help="infra YAML (instead of the recipe's infra: block)")


def register(sub: Any) -> None:
    p = sub.add_parser(
        "dockyard",
        help="dockyard RL training on KubeRay: render, check, run, cluster, status, logs, job, dev, doctor",
        description=(
            "Turn a dockyard recipe plus an infra spec (dockyard-k8s InfraConfig) into the "
            "manifests of one training run: sandbox executor pool, then a RayJob or RayCluster."
        ),
    )
    verbs = p.add_subparsers(dest="dockyard_command", metavar="VERB", parser_class=_IntermixedParser)
    p.set_defaults(func=lambda _args: _help(p))

    r = verbs.add_parser(
        "render",
        help="print the manifests in apply order (multi-document YAML)",
        description="Print the manifests in apply order. Nothing is sent anywhere. Example: "
        "nymph dockyard render recipe.yaml --infra run.infra.yaml | kubectl apply --dry-run=server -f -",
    )
    _common(r)
    r.add_argument(
        "--dry-run",
        action="store_true",
        help="send everything rendered through a server-side dry run (kubectl apply --dry-run=server) "
        "instead of printing it; nothing changes",
    )
    r.add_argument("--kubeconfig", metavar="FILE", help="with --dry-run: kubeconfig")
    r.add_argument("--context", help="with --dry-run: kube context")
    r.set_defaults(func=cmd_render)

    c = verbs.add_parser(
        "check",
        help="validate and summarise a recipe + infra pair",
        description="Validate a recipe + infra pair and print a one-page summary, or with -o "
        "write the fully resolved bundle (infra, recipe, manifests; .json or YAML by extension).",
    )
    _common(c)
    c.add_argument("-o", "--output", metavar="FILE", help="write the resolved bundle to FILE")
    c.set_defaults(func=cmd_check)

    dockyard_live.register(verbs, common=_common, load=_load, parser_class=_IntermixedParser)


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2
