"""Run handles: what ``run`` submitted, cached so the ``job`` verbs find it again.

One JSON file per run under ``<user cache>/nymph/dockyard/runs/<run id>.json``: the run id,
how it was submitted (``rest``: a Ray job; ``exec``: a process on the head pod), the
RayCluster, the namespace, the recipe it came from and, for ``exec``, the head pod and the
run's directory there. ``job logs|stop`` take a run id (its handle names the cluster) or a
recipe (its latest run).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import platformdirs

from nymph.dockyard.errors import DockyardLiveError

RUNS_ENV = "NYMPH_DOCKYARD_RUNS"


def runs_dir() -> Path:
    explicit = os.environ.get(RUNS_ENV)
    if explicit:
        return Path(explicit)
    return platformdirs.user_cache_path("nymph") / "dockyard" / "runs"


@dataclass(frozen=True, kw_only=True)
class RunHandle:
    run_id: str
    kind: Literal["rest", "exec"]
    cluster: str
    namespace: str
    recipe: str  # absolute path of the recipe file
    created: float
    pod: str | None = None  # exec: the head pod
    run_dir: str | None = None  # exec: the run's directory on the head pod
    ray_address: str | None = None  # rest: an explicit --ray-address, if one was used


def save(handle: RunHandle, *, directory: Path | None = None) -> Path:
    where = directory or runs_dir()
    try:
        where.mkdir(parents=True, exist_ok=True)
        path = where / f"{handle.run_id}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(handle), indent=2), encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        raise DockyardLiveError(
            f"cannot cache the run handle in {where} ({exc.__class__.__name__})"
        ) from None
    return path


def _read(path: Path) -> RunHandle | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        return RunHandle(**doc)
    except (OSError, ValueError, TypeError):
        return None


def load(run_id: str, *, directory: Path | None = None) -> RunHandle | None:
    if "/" in run_id or run_id.startswith("."):
        return None
    return _read((directory or runs_dir()) / f"{run_id}.json")


def latest_for_recipe(recipe: Path, *, directory: Path | None = None) -> RunHandle | None:
    """The newest handle of runs of ``recipe``."""
    where = directory or runs_dir()
    target = str(recipe.resolve())
    found = [h for p in sorted(where.glob("*.json")) if (h := _read(p)) is not None and h.recipe == target]
    return max(found, key=lambda h: h.created, default=None)


def new(
    *,
    run_id: str,
    kind: Literal["rest", "exec"],
    cluster: str,
    namespace: str,
    recipe: Path,
    pod: str | None = None,
    run_dir: str | None = None,
    ray_address: str | None = None,
) -> RunHandle:
    return RunHandle(
        run_id=run_id,
        kind=kind,
        cluster=cluster,
        namespace=namespace,
        recipe=str(recipe.resolve()),
        created=time.time(),
        pod=pod,
        run_dir=run_dir,
        ray_address=ray_address,
    )
