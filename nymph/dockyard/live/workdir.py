"""``codeSource: upload``: the working dir, packaged for a Ray job's ``runtime_env``.

What is packaged, as in dockyard-k8s: the paths of ``launch.rayUploadPaths`` (else the
dockyard_rl package directories of :data:`DEFAULT_UPLOAD_PATHS`) under ``--repo-root``, paths
that do not exist skipped, caches / virtualenvs / git metadata / ``.gitignore`` left out, plus
the resolved recipe as ``dockyard_run.yaml``. The zip must stay under the Ray dashboard's
100 MiB limit; it is uploaded once per content (``gcs://_ray_pkg_<sha1>.zip``).
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from nymph.dockyard.errors import DockyardLiveError

MAX_PACKAGE_BYTES = 100 * 1024 * 1024
STAGED_RECIPE = "dockyard_run.yaml"
DEFAULT_UPLOAD_PATHS = (
    "algorithms",
    "cluster",
    "data",
    "distributed",
    "environments",
    "experience",
    "models",
    "rewards",
    "sandbox",
    "utils",
    "examples",
    "pyproject.toml",
)
EXCLUDED = (
    ".gitignore",
    "__pycache__",
    "*.pyc",
    "*.pyo",
    ".venv",
    ".git",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    "*.egg-info",
)
#: the fixed timestamp of every entry: the same files give the same package
_EPOCH = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class Package:
    data: bytes
    files: int

    @property
    def uri(self) -> str:
        return f"gcs://_ray_pkg_{hashlib.sha1(self.data, usedforsecurity=False).hexdigest()}.zip"


def _excluded(name: str) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for pattern in EXCLUDED)


def _walk(root: Path, rel: Path) -> Iterator[tuple[Path, str]]:
    path = root / rel
    if _excluded(path.name) or (path.is_symlink() and not path.exists()):
        return
    if path.is_dir():
        for child in sorted(path.iterdir()):
            yield from _walk(root, rel / child.name)
    elif path.is_file():
        yield path, rel.as_posix()


def package(
    repo_root: Path, *, include: Sequence[str] | None = None, extra: Mapping[str, str] | None = None
) -> Package:
    """The zip of the working dir (see the module docstring)."""
    if not repo_root.is_dir():
        raise DockyardLiveError(f"--repo-root {repo_root}: not a directory")
    buf = io.BytesIO()
    count = 0
    size = 0
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for rel in include if include is not None else DEFAULT_UPLOAD_PATHS:
            if rel.startswith("/") or ".." in Path(rel).parts:
                raise DockyardLiveError(f"launch.rayUploadPaths: {rel!r} must be a path inside --repo-root")
            if not (repo_root / rel).exists():
                continue
            for path, name in _walk(repo_root, Path(rel)):
                size += path.stat().st_size
                if size > MAX_PACKAGE_BYTES:
                    raise DockyardLiveError(_too_big(repo_root, name))
                zf.writestr(zipfile.ZipInfo(name, _EPOCH), path.read_bytes())
                count += 1
        for name, text in (extra or {}).items():
            zf.writestr(zipfile.ZipInfo(name, _EPOCH), text)
            count += 1
    data = buf.getvalue()
    if len(data) > MAX_PACKAGE_BYTES:
        raise DockyardLiveError(_too_big(repo_root, None))
    return Package(data=data, files=count)


def _too_big(root: Path, at: str | None) -> str:
    where = f" (reached at {at})" if at else ""
    return (
        f"the working dir under {root} is over the Ray dashboard's 100 MiB upload limit{where}: "
        "narrow launch.rayUploadPaths, or use --code-source image / lustre"
    )
