"""Result files: which paths are acceptable (pure).

A result path is relative to the job's ``/workdir/out/``: POSIX separators, no empty, ``.`` or
``..`` segment, no NUL or control character, at most 1024 bytes. The daemon collects only
regular files (never a symlink, nothing resolving outside the workdir); the queue checks every
path again, and the CLI once more before it writes a file under ``-o DIR``.
"""

from __future__ import annotations

#: The default cap on an instance's result files, in bytes.
DEFAULT_RESULTS_CAP = 64 * 1024 * 1024
#: The directory in the workdir whose files are the results.
RESULTS_DIR = "out"
MAX_PATH_BYTES = 1024


class BadResultPath(ValueError):
    pass


def check_result_path(path: str) -> str:
    """``path`` if it is an acceptable result path, else :class:`BadResultPath`."""
    if not path or len(path.encode("utf-8", errors="replace")) > MAX_PATH_BYTES:
        raise BadResultPath("a result path has 1 to 1024 bytes")
    if path.startswith("/") or "\\" in path:
        raise BadResultPath(f"result path {path[:80]!r} must be relative, with / separators")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in path):
        raise BadResultPath("a result path has no control characters")
    for segment in path.split("/"):
        if segment in ("", ".", ".."):
            raise BadResultPath(f"result path {path[:80]!r} has an empty, '.' or '..' segment")
    return path
