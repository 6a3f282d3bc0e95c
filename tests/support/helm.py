"""helm for the chart's tests: built from its Go module into the per-user cache by
``tests/envtest/build-tools.sh helm`` (``make envtest`` runs it), found through the directory that
script prints; and the chart rendered as plain objects.

* ``helm`` (session): the helm binary. Without it (no Go, no cache) the tests that use it skip
  with a message saying how to get it, or fail when ``NYMPH_E2E=require`` (CI).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "nymph"
BUILD_TOOLS = REPO / "tests" / "envtest" / "build-tools.sh"
#: What Helm adds to every object's labels; manifests/base has none of these.
HELM_LABELS = ("app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "helm.sh/chart")


def helm_path() -> Path:
    """The cached helm binary (built first when missing and Go is there), or ``RuntimeError``."""
    res = subprocess.run(
        ["bash", str(BUILD_TOOLS), "helm"], capture_output=True, text=True, timeout=1800, check=False
    )
    lines = res.stdout.strip().splitlines()
    if res.returncode != 0 or not lines or not (Path(lines[-1]) / "helm").is_file():
        raise RuntimeError(f"tests/envtest/build-tools.sh helm failed: {res.stderr.strip()[-500:]}")
    return Path(lines[-1]) / "helm"


@pytest.fixture(scope="session")
def helm() -> Path:
    try:
        return helm_path()
    except RuntimeError as exc:
        if os.environ.get("NYMPH_E2E", "").strip().lower() == "require":
            pytest.fail(f"NYMPH_E2E=require but {exc}", pytrace=False)
        pytest.skip(f"{exc} (make envtest builds helm)")


def run_helm(
    helm: Path, *args: str, check: bool = True, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(
        [str(helm), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **(env or {})},
    )
    if check and res.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)}: {res.stderr}")
    return res


@dataclass(frozen=True)
class Helm:
    """helm against one cluster, its own state (repositories, cache) under ``home``."""

    binary: Path
    kubeconfig: Path
    home: Path

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {f"HELM_{d}_HOME": str(self.home / d.lower()) for d in ("CACHE", "CONFIG", "DATA")}
        return run_helm(self.binary, *args, check=check, env={**env, "KUBECONFIG": str(self.kubeconfig)})


def template(helm: Path, *args: str, release: str = "nymph") -> list[dict[str, Any]]:
    """``helm template`` of the chart (with ``args``, e.g. ``--set``), as plain objects."""
    out = run_helm(helm, "template", release, str(CHART), *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


__all__ = ["helm"]
