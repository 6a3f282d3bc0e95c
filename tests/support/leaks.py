"""Find secret values in files and texts: the grep of the fault suite's secrets checks."""

from __future__ import annotations

import base64
from collections.abc import Iterable
from pathlib import Path

import yaml

MIN_SECRET = 12  # shorter values would match by chance


def kubeconfig_secrets(path: Path) -> list[str]:
    """The credentials in a kubeconfig: tokens, client keys (as written and base64-decoded)."""
    config = yaml.safe_load(path.read_text())
    found: list[str] = []
    for user in config.get("users") or []:
        u = user.get("user") or {}
        if u.get("token"):
            found.append(str(u["token"]))
        if u.get("client-key-data"):
            found.append(str(u["client-key-data"]))
            key = base64.b64decode(u["client-key-data"]).decode(errors="replace")
            found += [line for line in key.splitlines() if len(line) >= 40 and "-----" not in line][:2]
    return found


def variants(secret: str) -> set[bytes]:
    raw = secret.encode()
    out = {raw}
    if "." in secret:  # a JWT: its signature alone is a secret too
        out.add(secret.rsplit(".", 1)[-1].encode())
    return {v for v in out if len(v) >= MIN_SECRET}


def scan_files(roots: Iterable[Path], secrets: dict[str, str], *, skip: set[Path]) -> list[str]:
    """``where: which`` for every secret (by label) found in a file under ``roots``."""
    needles = {label: variants(value) for label, value in secrets.items()}
    hits: list[str] = []
    for root in roots:
        paths = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for p in paths:
            if p.resolve() in skip:
                continue
            try:
                data = p.read_bytes()
            except OSError:
                continue
            hits += [f"{p}: {label}" for label, vs in needles.items() if any(v in data for v in vs)]
    return hits


def scan_texts(texts: dict[str, str], secrets: dict[str, str]) -> list[str]:
    needles = {label: variants(value) for label, value in secrets.items()}
    return [
        f"{where}: {label}"
        for where, text in texts.items()
        for label, vs in needles.items()
        if any(v in text.encode(errors="replace") for v in vs)
    ]
