"""Crash-safe writes for the daemon's state files.

* :func:`append_whole` appends one record and fsyncs it, or leaves the file as it was: when a
  write or fsync fails (ENOSPC, EIO...), the file is truncated back to its previous length, so
  no torn record stays behind. If even that fails, :class:`TornAppend` says where the file
  must be cut before anything else is appended.
* :func:`replace_atomically` writes a small file whole or not at all (temp file, fsync, rename,
  fsync of the directory), so a kill at any moment leaves the old or the new content.

``write`` is a seam for tests that inject a failing write; it defaults to :func:`os.write`.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

Writer = Callable[[int, bytes], int]


class TornAppend(OSError):
    """An append failed and the partial record could not be removed; cut the file at ``keep``."""

    def __init__(self, errno_: int, strerror: str, *, keep: int) -> None:
        super().__init__(errno_, strerror)
        self.keep = keep


def _write_all(fd: int, data: bytes, write: Writer) -> None:
    view = memoryview(data)
    while view:
        n = write(fd, bytes(view))
        if n <= 0:
            raise OSError(5, "short write")
        view = view[n:]


def append_whole(
    path: Path, data: bytes, *, mode: int = 0o640, write: Writer | None = None, sync: bool = True
) -> int:
    """Append ``data`` and fsync it (``sync=False``: the caller fsyncs later, see
    :func:`fsync_file`); on failure restore the old length and re-raise.

    Returns the file's length before the append (where the record starts).
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, mode)
    try:
        return _append_at(fd, os.fstat(fd).st_size, data, write=write, sync=sync)
    finally:
        os.close(fd)


def _append_at(fd: int, keep: int, data: bytes, *, write: Writer | None, sync: bool) -> int:
    """Append ``data`` to ``fd``, a file ``keep`` bytes long, and fsync it (unless not
    ``sync``); on failure cut the file back to ``keep`` and re-raise (:class:`TornAppend` when
    even that fails). Returns ``keep``."""
    try:
        _write_all(fd, data, write or os.write)
        if sync:
            os.fsync(fd)
    except OSError as exc:
        try:
            os.ftruncate(fd, keep)
            with contextlib.suppress(OSError):
                os.fsync(fd)
        except OSError:
            raise TornAppend(exc.errno or 5, exc.strerror or str(exc), keep=keep) from exc
        raise
    return keep


class Appender:
    """:func:`append_whole` and :func:`fsync_file` on ``path`` through one descriptor kept open
    between them (``O_APPEND``): an append or a sync no longer pays an open and a close, the
    costliest part of a small write on ext4. Whoever puts another file at ``path`` (a rename
    over it) calls :meth:`close`; a cut of the file (:func:`truncate_to`) keeps it the same
    file; a file removed meanwhile is noticed at the next append, which makes a new one (as
    an open of the path would), and one moved aside goes on being written, as a log is. The
    descriptor is closed with :meth:`close`, or when the object goes."""

    def __init__(self, path: Path, *, mode: int = 0o640) -> None:
        self.path = path
        self.mode = mode
        self._fd: int | None = None
        self._closer: weakref.finalize[Any, Any] | None = None

    def _open(self) -> int:
        if self._fd is None:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, self.mode)
            self._fd = fd
            self._closer = weakref.finalize(self, _close_quietly, fd)
        return self._fd

    def append(self, data: bytes, *, write: Writer | None = None, sync: bool = True) -> int:
        """As :func:`append_whole`: ``data`` appended (and fsynced unless ``sync=False``), or the
        file left as it was; the file's length before the append."""
        fd = self._open()
        st = os.fstat(fd)
        if st.st_nlink == 0:  # removed meanwhile: what is written now goes to a new one
            self.close()
            fd = self._open()
            st = os.fstat(fd)
        try:
            return _append_at(fd, st.st_size, data, write=write, sync=sync)
        except TornAppend:
            self.close()
            raise

    def fsync(self) -> None:
        """As :func:`fsync_file`: what was appended made durable (through the held descriptor)."""
        if self._fd is None:
            fsync_file(self.path)
        else:
            os.fsync(self._fd)

    def close(self) -> None:
        """Let go of the file held: the next append opens whatever ``path`` names then."""
        if self._closer is not None:
            self._closer()
        self._fd = None
        self._closer = None


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def truncate_to(path: Path, size: int) -> None:
    """Cut ``path`` to ``size`` bytes (no-op when it is already no longer) and fsync it."""
    fd = os.open(path, os.O_WRONLY)
    try:
        if os.fstat(fd).st_size > size:
            os.ftruncate(fd, size)
            os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    """fsync what was appended to ``path`` without it (no-op when the file is gone)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_in_place(path: Path, data: bytes, *, mode: int = 0o640) -> None:
    """Overwrite the start of ``path`` with ``data`` (created if missing), not fsynced: for a
    small position of fixed width that may lag and is rewritten often (anything after it, from
    some other writer, is cut; a symlink at ``path`` is refused). Cheaper than
    :func:`replace_atomically` (no temp file, no rename); a write of one page is never torn by a
    kill of the process, and a reader takes anything unreadable for "from the start"."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, mode)
    try:
        if os.pwrite(fd, data, 0) != len(data):
            raise OSError(5, "short write")
        if os.fstat(fd).st_size > len(data):  # longer than any write of it: cut what follows
            os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def replace_atomically(path: Path, data: bytes, *, mode: int = 0o640, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves either the old or the new file.

    ``durable=False`` skips both fsyncs, for a position that may lag behind what it marks
    (an outbox ack, the audit log's head): a killed process loses nothing (the page cache
    survives it), and after a power loss the file is the old one, the new one, or empty, each
    of which its reader accepts. That is two fsyncs less on every write of it."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        try:
            _write_all(fd, data, os.write)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    if durable:
        fsync_dir(path.parent)
