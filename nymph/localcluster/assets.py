"""Finding the control-plane binaries (``KUBEBUILDER_ASSETS`` or the build cache)."""

from __future__ import annotations

import os
from pathlib import Path

from nymph.errors import NymphError

REQUIRED = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kwok")
HOW_TO_GET = (
    "run `make envtest` (builds them from Go modules into ~/.cache/nymph/envtest, shared by every "
    "clone, several minutes the first time) or point KUBEBUILDER_ASSETS at a directory holding etcd, kube-apiserver, "
    "kube-scheduler, kube-controller-manager and kwok"
)


class AssetsMissing(NymphError):
    pass


def cache_root() -> Path:
    """The per-user asset cache shared by every clone: ``$NYMPH_CACHE_DIR`` or ``$XDG_CACHE_HOME/nymph``."""
    explicit = os.environ.get("NYMPH_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "nymph"


def missing_in(path: Path) -> list[str]:
    return [b for b in REQUIRED if not os.access(path / b, os.X_OK)]


def find_assets() -> Path:
    """The directory holding all control-plane binaries, or :class:`AssetsMissing`."""
    env = os.environ.get("KUBEBUILDER_ASSETS")
    if env:
        path = Path(env)
        missing = missing_in(path)
        if not missing:
            return path
        raise AssetsMissing(f"KUBEBUILDER_ASSETS={env} lacks {', '.join(missing)}; {HOW_TO_GET}")
    cache = cache_root() / "envtest"
    candidates = (
        sorted(cache.glob("*/bin"), key=lambda p: p.stat().st_mtime, reverse=True) if cache.is_dir() else []
    )
    for path in candidates:
        if not missing_in(path):
            return path
    raise AssetsMissing(f"no control-plane binaries found; {HOW_TO_GET}")
