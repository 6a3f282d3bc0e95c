"""The SQLite file's mode: 0600, whoever creates it.

The database holds launch scripts and env values in clear and the token hashes, like the secret
store's key file beside it (``<db>.secret-key``, 0600). Whatever opens it first (``nymph queue
token create`` usually, or ``queue serve``) creates it 0600 before SQLite opens it; SQLite then
gives its ``-wal``, ``-shm`` and ``-journal`` files the database file's own mode. A file that
group or others may read (one made by an older nymph, 0644 under the usual umask) is tightened
to 0600 when it is opened, with a log line, and so are its companions.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import structlog

from nymph.errors import NymphError

log = structlog.get_logger(__name__, component="queue.db")

PRIVATE = 0o600
#: The files SQLite keeps beside the database (WAL mode: -wal and -shm; -journal while the
#: mode is switched).
COMPANIONS = ("-wal", "-shm", "-journal")


class DatabaseFileError(NymphError):
    """The database file cannot be created private, or a readable one cannot be tightened."""


def companions(path: Path) -> list[Path]:
    return [path.with_name(path.name + suffix) for suffix in COMPANIONS]


def make_private(path: Path) -> None:
    """Create ``path`` 0600 if it does not exist; tighten it and its companions to 0600 if
    group or others have any access to them."""
    _create(path)
    for p in (path, *companions(path)):
        _tighten(p)


def _create(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, PRIVATE)
    except FileExistsError:
        return
    except OSError as exc:
        raise DatabaseFileError(f"cannot create the queue database {path}: {exc}") from exc
    try:
        os.fchmod(fd, PRIVATE)  # exactly 0600, whatever the umask took away
    finally:
        os.close(fd)
    log.info("database file created", path=str(path), mode="0600")


def _tighten(path: Path) -> None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise DatabaseFileError(f"cannot read the mode of {path}: {exc}") from exc
    if not stat.S_ISREG(st.st_mode) or not st.st_mode & 0o077:
        return
    try:
        os.chmod(path, PRIVATE)
    except OSError as exc:
        raise DatabaseFileError(
            f"{path} may be read by other users (mode {stat.S_IMODE(st.st_mode):04o}) and cannot be "
            f"made 0600: {exc}; chmod 600 it as its owner"
        ) from exc
    log.warning(
        "database file was readable by other users; tightened to 0600",
        path=str(path),
        was=f"{stat.S_IMODE(st.st_mode):04o}",
    )
