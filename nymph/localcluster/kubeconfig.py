"""Kubeconfig files for the local cluster (certificates inline, written 0600)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml

CLUSTER = "nymph-local"


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def _write(
    path: Path, *, server: str, ca_cert: Path, user: str, creds: dict[str, Any], namespace: str | None
) -> Path:
    context: dict[str, str] = {"cluster": CLUSTER, "user": user}
    if namespace:
        context["namespace"] = namespace
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": CLUSTER, "cluster": {"server": server, "certificate-authority-data": _b64(ca_cert)}}
        ],
        "users": [{"name": user, "user": creds}],
        "contexts": [{"name": CLUSTER, "context": context}],
        "current-context": CLUSTER,
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def cert_kubeconfig(path: Path, *, server: str, ca_cert: Path, cert: Path, key: Path, user: str) -> Path:
    """A kubeconfig that authenticates with a client certificate."""
    creds = {"client-certificate-data": _b64(cert), "client-key-data": _b64(key)}
    return _write(path, server=server, ca_cert=ca_cert, user=user, creds=creds, namespace=None)


def token_kubeconfig(path: Path, *, server: str, ca_cert: Path, token: str, namespace: str) -> Path:
    """A kubeconfig that authenticates with a bearer token (e.g. a ServiceAccount's)."""
    return _write(
        path, server=server, ca_cert=ca_cert, user="token-user", creds={"token": token}, namespace=namespace
    )
