"""The dockyard layers: ``spec`` <- ``render`` (pure) <- ``live``; argparse only in ``nymph.cli``."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import nymph.dockyard

PACKAGE = Path(nymph.dockyard.__file__).parent

#: What a pure module may not pull in, directly or through another module.
NOT_PURE = (
    "nymph.dockyard.live",
    "nymph.kube",
    "nymph.queue",
    "nymph.daemon",
    "nymph.cli",
    "nymph.localcluster",
    "aiohttp",
    "kubernetes_asyncio",
    "subprocess",
)


def _loaded_after_importing(*packages: str) -> list[str]:
    """The modules a fresh interpreter holds after importing every module of ``packages``."""
    code = (
        "import importlib, json, pkgutil, sys\n"
        f"for name in {list(packages)!r}:\n"
        "    pkg = importlib.import_module(name)\n"
        "    for info in pkgutil.iter_modules(pkg.__path__):\n"
        "        importlib.import_module(f'{name}.{info.name}')\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    loaded: list[str] = json.loads(out.stdout)
    return loaded


def _offending(loaded: list[str], forbidden: tuple[str, ...]) -> list[str]:
    return [m for m in loaded if any(m == f or m.startswith(f + ".") for f in forbidden)]


def test_render_and_spec_pull_in_no_io_module() -> None:
    loaded = _loaded_after_importing("nymph.dockyard.spec", "nymph.dockyard.render")
    assert "nymph.dockyard.render.manifests" in loaded
    assert _offending(loaded, NOT_PURE) == []


def test_spec_does_not_depend_on_render_or_live() -> None:
    loaded = _loaded_after_importing("nymph.dockyard.spec")
    assert "nymph.dockyard.spec.load" in loaded
    assert _offending(loaded, ("nymph.dockyard.render", "nymph.dockyard.live")) == []


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_library_parses_no_arguments(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])
    }
    assert "argparse" not in imported
    assert not any(name.startswith("nymph.cli") for name in imported)


def _walked(package: str, *extra: str) -> list[str]:
    """The modules a fresh interpreter holds after importing ``package`` and all below it."""
    code = (
        "import importlib, json, pkgutil, sys\n"
        f"pkg = importlib.import_module({package!r})\n"
        f"for info in pkgutil.walk_packages(pkg.__path__, {package + '.'!r}):\n"
        "    importlib.import_module(info.name)\n"
        f"for name in {list(extra)!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    loaded: list[str] = json.loads(out.stdout)
    return loaded


def test_the_daemon_pod_path_loads_neither_omegaconf_nor_pydantic() -> None:
    loaded = _walked("nymph.daemon", "nymph.cli.daemon")
    assert "nymph.daemon.tasks.dockyard" in loaded and "nymph.daemon.tasks.pods" in loaded
    assert _offending(loaded, ("omegaconf", "pydantic", "nymph.dockyard.spec", "nymph.dockyard.render")) == []


def test_loading_an_infra_uses_omegaconf_and_pydantic() -> None:
    loaded = _loaded_after_importing("nymph.dockyard.spec")
    assert "omegaconf" not in loaded  # imported on first use
    assert "pydantic" in loaded
