"""Workdirs: ``<root>/work/<instanceId>``, created before the apply, removed by the reaper.

Ownership and mode: created by the daemon's user with mode 0775 (``work.dir_mode``), and
chowned to ``work.owner`` (uid, gid) when set, so a Pod running as that user can write. The
path is built only from a validated instance id under the root, and a symlink (or anything but
a directory) at its place is refused: nothing outside the root is ever created or removed.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from nymph.errors import NymphError
from nymph.launch.names import check_instance_id
from nymph.launch.render import workdir_path


class WorkdirError(NymphError):
    pass


class WorkdirWriteError(WorkdirError):
    """The root could not be written (ENOSPC, EROFS, EIO...): not this launch's fault."""


class Workdirs:
    def __init__(self, *, root: Path, mode: int = 0o775, owner: tuple[int, int] | None = None) -> None:
        self.root = Path(root)
        self.base = self.root / "work"
        self.mode = mode
        self.owner = owner

    def path(self, instance_id: str) -> Path:
        return Path(workdir_path(str(self.root), check_instance_id(instance_id)))

    def _inside(self, path: Path) -> Path:
        real_base = self.base.resolve()
        real = path.resolve()
        if real.parent != real_base:
            raise WorkdirError(f"refusing workdir {path}: it resolves outside {self.base}")
        return real

    def create(self, instance_id: str) -> Path:
        """Create the workdir (or take the one there: a launch adopted again), mode set.
        A symlink or anything else not a directory at its place is refused. A mkdir, an lstat
        and a chmod when ``work/`` exists (every launch but the first)."""
        path = self.path(instance_id)
        try:
            try:
                os.mkdir(path, self.mode)
            except FileNotFoundError:
                self.base.mkdir(parents=True, exist_ok=True)
                self._inside(path)
                path.mkdir(mode=self.mode, exist_ok=True)
            except FileExistsError:
                pass
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                raise WorkdirError(f"refusing workdir {path}: a symlink, which may lead outside {self.base}")
            if not stat.S_ISDIR(mode):
                raise WorkdirError(f"refusing workdir {path}: not a plain directory")
            os.chmod(path, self.mode)
            if self.owner is not None:
                os.chown(path, *self.owner)
        except OSError as exc:
            raise WorkdirWriteError(f"cannot create workdir {path}: {exc.strerror or exc}") from None
        return path

    def remove(self, instance_id: str) -> bool:
        path = self.path(instance_id)
        if not path.exists() and not path.is_symlink():
            return False
        if path.is_symlink():
            path.unlink()
            return True
        self._inside(path)
        shutil.rmtree(path)
        return True

    def existing(self) -> list[str]:
        if not self.base.is_dir():
            return []
        return sorted(p.name for p in self.base.iterdir())
