"""Write dockyard-k8s's own render of each ``*.infra.yaml`` here as ``*.upstream.yaml``.

The goldens that ``tests/dockyard/test_upstream_golden.py`` compares nymph's render with are
dockyard-k8s's output, not expectations written by hand. Regenerate them after changing a case
or when dockyard-k8s changes, from a checkout of its repository (its ``infra/dockyard_k8s``
package needs only pydantic, omegaconf and PyYAML to render):

    python tests/dockyard/golden/render_upstream.py PATH/TO/dockyard_rl

Each infra is validated by dockyard-k8s's own ``InfraConfig`` and rendered by its
``render_manifests``, with an empty recipe, exactly as its ``render`` command does after loading.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent


def _render(infra: dict[str, Any]) -> list[dict[str, Any]]:
    config = importlib.import_module("dockyard_k8s.config")
    render = importlib.import_module("dockyard_k8s.render")
    schema = importlib.import_module("dockyard_k8s.schema")
    omegaconf = importlib.import_module("omegaconf")
    loaded = config.LoadedConfig(
        recipe=omegaconf.OmegaConf.create({}),
        infra=schema.InfraConfig.model_validate(infra),
        source_path=Path("recipe.yaml"),
    )
    manifests: list[dict[str, Any]] = render.render_manifests(loaded)
    return manifests


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write(__doc__ or "")
        return 2
    source = Path(argv[0]).resolve() / "infra" / "dockyard_k8s" / "src"
    if not (source / "dockyard_k8s" / "render.py").is_file():
        sys.stderr.write(f"no dockyard_k8s package under {source}\n")
        return 2
    sys.path.insert(0, str(source))
    for case in sorted(HERE.glob("*.infra.yaml")):
        infra = yaml.safe_load(case.read_text(encoding="utf-8"))
        out = case.with_name(case.name.replace(".infra.yaml", ".upstream.yaml"))
        header = f"# dockyard-k8s's render of {case.name} (written by {Path(__file__).name})\n"
        out.write_text(header + yaml.safe_dump_all(_render(infra), sort_keys=False), encoding="utf-8")
        sys.stdout.write(f"{out.relative_to(HERE.parents[2])}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
