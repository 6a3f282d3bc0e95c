"""Reading a launch's script from a file or stdin."""

from __future__ import annotations

import sys
from pathlib import Path

from nymph.errors import ConfigError


def read_script(path: str) -> str:
    """The text of ``--script PATH`` (``-`` for stdin), or a one-line ConfigError."""
    if path == "-":
        return sys.stdin.read()
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"--script {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--script {path}: cannot read ({exc.__class__.__name__})") from None
