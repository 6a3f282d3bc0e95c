"""The daemon's RBAC rules (the same as manifests/base/daemon-role.yaml; a test keeps them equal)."""

from __future__ import annotations

from typing import Any

DAEMON_ROLE_RULES: list[dict[str, Any]] = [
    {
        "apiGroups": [""],
        "resources": ["pods"],
        "verbs": ["create", "get", "list", "watch", "delete", "patch"],
    },
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
]
