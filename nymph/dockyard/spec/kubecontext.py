"""Namespace inference without a cluster call.

Order: the current kube context's namespace (kubeconfig files from ``KUBECONFIG``, else
``~/.kube/config``, merged the way kubectl does: the first file to set a value wins), then
the in-pod service-account namespace file, then ``default``. Unreadable or malformed
kubeconfig files are skipped (the caller shows where the namespace came from).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

SA_NAMESPACE_PATH = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass(frozen=True, kw_only=True)
class NamespaceChoice:
    namespace: str
    source: str


def kubeconfig_paths(*, env: Mapping[str, str], home: Path) -> list[Path]:
    raw = env.get("KUBECONFIG", "")
    paths = [Path(p) for p in raw.split(os.pathsep) if p]
    return paths or [home / ".kube" / "config"]


def _read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None


def context_namespace(paths: Sequence[Path], *, context: str | None = None) -> NamespaceChoice | None:
    """The namespace of ``context`` (default: the current context), if any file names one."""
    current: str | None = context
    contexts: dict[str, tuple[Any, Path]] = {}
    for path in paths:
        doc = _read_yaml(path)
        if not isinstance(doc, dict):
            continue
        if current is None and isinstance(doc.get("current-context"), str) and doc["current-context"]:
            current = doc["current-context"]
        for entry in doc.get("contexts") or []:
            if isinstance(entry, dict) and isinstance(entry.get("name"), str):
                contexts.setdefault(entry["name"], (entry.get("context"), path))
    if current is None or current not in contexts:
        return None
    context, path = contexts[current]
    if isinstance(context, dict):
        ns = context.get("namespace")
        if isinstance(ns, str) and ns.strip():
            return NamespaceChoice(namespace=ns.strip(), source=f"kube context {current!r} ({path})")
    return None


def service_account_namespace(path: Path) -> NamespaceChoice | None:
    try:
        ns = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return NamespaceChoice(namespace=ns, source=f"service account ({path})") if ns else None


def infer_namespace(
    *, kubeconfigs: Sequence[Path], sa_namespace_path: Path, context: str | None = None
) -> NamespaceChoice:
    return (
        context_namespace(kubeconfigs, context=context)
        or service_account_namespace(sa_namespace_path)
        or NamespaceChoice(namespace="default", source="fallback")
    )
