"""A containerd root with the local images already imported, kept in the per-user cache.

Importing the python image (a 121 MiB layer) into a fresh containerd takes 10-30 s on two busy
cores, and deleting it again several more. So the first real node on a machine imports the
images once into a *seed* root (``<cache>/node-images/<key>/containerd-root``, keyed by the
archives and the containerd build), and every node starts from a hard-linked copy of it: a
fraction of a second, and cheap to delete. Content blobs and committed snapshots are only ever
read by containerd (overlayfs never writes to a lower layer); the bolt databases, which it
writes, are real copies. Without a seed on the same filesystem the node imports the archives
itself.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from nymph.localcluster.assets import cache_root


@dataclass(frozen=True)
class SeedImage:
    name: str
    archive: Path


def seed_key(images: Sequence[SeedImage], *, containerd: Path) -> str:
    h = hashlib.sha256()
    for i in sorted(images, key=lambda i: i.name):
        st = i.archive.stat()
        h.update(f"{i.name}\0{i.archive}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    h.update(str(containerd.resolve()).encode())
    return h.hexdigest()[:16]


def seeds_dir() -> Path:
    return cache_root() / "node-images"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_seed(key: str, build: Callable[[Path], None]) -> Path:
    """The seed root for ``key``, built once with ``build(tmp_root)`` under a lock."""
    seed = seeds_dir() / key / "containerd-root"
    with _locked(seeds_dir() / f".{key}.lock"):
        if seed.is_dir():
            return seed
        tmp = seeds_dir() / f".tmp-{key}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            build(tmp)
            seed.parent.mkdir(parents=True, exist_ok=True)
            (tmp / "containerd-root").rename(seed)
            # Seeds of other images or containerd builds are stale: nodes started from them hold
            # their own hard links, so removing them takes nothing from a running node.
            for old in seeds_dir().iterdir():
                if old.is_dir() and not old.name.startswith(".") and old.name != key:
                    subprocess.run(
                        ["rm", "-rf", "--one-file-system", str(old)], capture_output=True, check=False
                    )
        finally:
            subprocess.run(["rm", "-rf", "--one-file-system", str(tmp)], capture_output=True, check=False)
    return seed


def same_filesystem(a: Path, b: Path) -> bool:
    try:
        return a.stat().st_dev == b.stat().st_dev
    except OSError:
        return False


def link_copy(seed: Path, root: Path) -> None:
    """``root`` as hard links to ``seed``'s files, with real copies of the bolt databases."""
    res = subprocess.run(["cp", "-al", str(seed), str(root)], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise OSError(f"cp -al {seed} {root}: {res.stderr.strip()}")
    for db in root.rglob("*.db"):
        tmp = db.with_name(db.name + ".copy")
        shutil.copy2(db, tmp)
        tmp.replace(db)
