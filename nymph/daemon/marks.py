"""Marks: a small JSON value per instance (a log cursor, "results uploaded"), kept in one
append-only file instead of one file per instance.

A file per instance cost every launch a new inode (its temp file), a rename and later an unlink:
on a node's disk the most expensive syscalls the daemon made per launch. Here a change is one
line appended to a file held open (``{"n": name, "v": value}``; ``{"n": name}`` forgets it), the
marks live in memory, and reading one costs no syscall. When the file holds many more lines
than live marks it is rewritten with the live ones only (whole or not at all).

Nothing here is fsynced: a mark that lags after a power cut only repeats work the queue takes as
the same (a log chunk again, dropped by offset; results uploaded again, idempotent by offset).
A torn last line, or any line that is not a mark, is skipped when the file is read.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from nymph import fastjson
from nymph.daemon.durable import replace_atomically

#: Rewrite the file when it holds more than this many lines per live mark (and at least
#: :data:`MIN_LINES_TO_COMPACT` lines).
COMPACT_FACTOR = 4
MIN_LINES_TO_COMPACT = 4096


def _line(name: str, value: dict[str, Any] | None) -> bytes:
    rec: dict[str, Any] = {"n": name} if value is None else {"n": name, "v": value}
    return fastjson.dumps(rec) + b"\n"


def _records(data: bytes) -> Iterator[tuple[str, dict[str, Any] | None]]:
    for raw in data.split(b"\n"):
        try:
            rec = json.loads(raw)  # exact: orjson (fastjson) reads an integer past 64 bits as a float
        except ValueError:
            continue  # a torn last line, or not a mark
        if not isinstance(rec, dict) or not isinstance(rec.get("n"), str):
            continue
        value = rec.get("v")
        yield rec["n"], value if isinstance(value, dict) else None


class MarkBook:
    """The marks in ``path``: :meth:`get`, :meth:`put`, :meth:`drop`. Not thread-safe (the
    daemon's event loop is its only user)."""

    def __init__(self, path: Path, *, mode: int = 0o640) -> None:
        self.path = Path(path)
        self.mode = mode
        self.marks: dict[str, dict[str, Any]] = {}
        self.lines = 0
        self._fd: int | None = None
        self._size = 0
        #: The file ends in a torn line: the next line starts with a newline of its own.
        self._torn = False
        # A book that cannot be read is taken as empty, as a missing one: the marks only save
        # work, which is repeated without them.
        with contextlib.suppress(OSError):
            data = self.path.read_bytes()
            self._torn = bool(data) and not data.endswith(b"\n")
            for name, value in _records(data):
                self.lines += 1
                if value is None:
                    self.marks.pop(name, None)
                else:
                    self.marks[name] = value

    def get(self, name: str) -> dict[str, Any] | None:
        return self.marks.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self.marks

    def put(self, name: str, value: dict[str, Any]) -> None:
        """Set ``name``'s mark; :class:`OSError` (and the mark unchanged) when it cannot be
        written."""
        self._append(_line(name, value))
        self.marks[name] = value
        self._maybe_compact()

    def drop(self, name: str) -> None:
        """Forget ``name``'s mark (nothing is written when there is none)."""
        if name not in self.marks:
            return
        self._append(_line(name, None))
        del self.marks[name]
        self._maybe_compact()

    def keep_only(self, live: set[str]) -> int:
        """Forget every mark but those of ``live``: how many were forgotten. For marks of
        instances whose Pods went while nobody watched (the daemon was down)."""
        gone = [name for name in self.marks if name not in live]
        for name in gone:
            self.drop(name)
        return len(gone)

    def _maybe_compact(self) -> None:
        if self.lines >= MIN_LINES_TO_COMPACT and self.lines > COMPACT_FACTOR * len(self.marks):
            with contextlib.suppress(OSError):  # a bigger file than needed, not a lost mark
                self.compact()

    def compact(self) -> None:
        """Rewrite the file with the live marks only. Durable (fsynced, then renamed): unlike
        one line, a rewrite lost to a power cut would lose every mark at once."""
        self.close()
        data = b"".join(_line(n, v) for n, v in self.marks.items())
        self.path.parent.mkdir(parents=True, exist_ok=True)
        replace_atomically(self.path, data, mode=self.mode, durable=True)
        self.lines = len(self.marks)
        self._torn = False

    def adopt(self, directory: Path, read: Callable[[Path], tuple[str, dict[str, Any]] | None]) -> int:
        """Take in the marks a daemon kept one file per instance in ``directory`` (``read``
        gives a file's instance and mark, None for a file that holds none), then remove those
        files and the directory: how many were taken. A file that cannot be read stays, and is
        read again at the next start."""
        try:
            files = sorted(p for p in directory.iterdir() if p.is_file() and not p.name.startswith("."))
        except OSError:
            return 0
        taken: list[Path] = []
        for f in files:
            try:
                mark = read(f)
            except (OSError, ValueError):
                continue
            if mark is not None and mark[0] not in self.marks:
                try:
                    self.put(*mark)
                except OSError:
                    break  # the disk is full or read-only: the rest stays for the next start
            taken.append(f)
        if taken:
            self._sync()
        for f in taken:
            with contextlib.suppress(OSError):
                f.unlink()
        for leftover in directory.glob(".*.tmp"):
            with contextlib.suppress(OSError):
                leftover.unlink()
        with contextlib.suppress(OSError):
            directory.rmdir()
        return len(taken)

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def _open(self) -> int:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, self.mode)
            self._size = os.fstat(fd).st_size
            self._fd = fd
        return self._fd

    def _append(self, data: bytes) -> None:
        fd = self._open()
        if self._torn:
            data = b"\n" + data
        try:
            written = os.write(fd, data)
            if written != len(data):
                raise OSError(5, "short write")
        except OSError:
            # Cut what part of the line got in; if even that fails, the next line starts with a
            # newline of its own (the part is then a line that is skipped).
            try:
                os.ftruncate(fd, self._size)
            except OSError:
                self._torn = True
            raise
        self._size += written
        self._torn = False
        self.lines += 1

    def _sync(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.fsync(self._fd)
