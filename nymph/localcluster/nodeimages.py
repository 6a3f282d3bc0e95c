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


KEEP = 3  # seeds of other image sets kept (concurrent runs with other sets, a branch switched back)


def _lock_path(key: str) -> Path:
    return seeds_dir() / f".{key}.lock"


@contextlib.contextmanager
def seed_root(key: str, build: Callable[[Path], None], *, keep: int = KEEP) -> Iterator[Path]:
    """The seed root for ``key`` (built once with ``build(tmp_root)``), held under a shared lock
    for the ``with`` block, so that no other run removes it while a node copies it.

    Building takes the key's lock exclusively. Afterwards seeds of other keys beyond the ``keep``
    most recently used are removed, each only if its own lock can be taken at once: a seed that
    another run is building or copying is never touched (nodes started from one hold their own
    hard links, so removing it takes nothing from a running node).
    """
    seed = seeds_dir() / key / "containerd-root"
    lock = _lock_path(key)
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_SH)
        if not seed.is_dir():
            fcntl.flock(fh, fcntl.LOCK_UN)
            fcntl.flock(fh, fcntl.LOCK_EX)
            if not seed.is_dir():
                _build(key, seed, build)
            fcntl.flock(fh, fcntl.LOCK_SH)  # a conversion: never unlocked in between
        with contextlib.suppress(OSError):
            os.utime(seed.parent)  # last used: what prune_seeds keeps
        try:
            prune_seeds(keep=keep, current=key)
            yield seed
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _build(key: str, seed: Path, build: Callable[[Path], None]) -> None:
    tmp = seeds_dir() / f".tmp-{key}-{os.getpid()}"
    _remove(tmp)
    tmp.mkdir(parents=True)
    try:
        build(tmp)
        seed.parent.mkdir(parents=True, exist_ok=True)
        (tmp / "containerd-root").rename(seed)
    finally:
        _remove(tmp)


def _remove(path: Path) -> None:
    subprocess.run(["rm", "-rf", "--one-file-system", str(path)], capture_output=True, check=False)


def prune_seeds(*, keep: int, current: str) -> list[str]:
    """Remove the seeds beyond the ``keep`` most recently used other than ``current``, skipping
    any whose lock another process holds; returns the keys removed."""
    others = sorted(
        (p for p in seeds_dir().iterdir() if p.is_dir() and not p.name.startswith(".") and p.name != current),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    removed: list[str] = []
    for old in others[keep:]:
        with _lock_path(old.name).open("a") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # being built or copied by another run
            try:
                _remove(old)
                removed.append(old.name)
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)
    return removed


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
