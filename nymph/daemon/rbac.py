"""The daemon's RBAC rules: the namespaced Role (manifests/base/daemon-role.yaml) and the
read-only node ClusterRole (manifests/base/daemon-node-reader.yaml); a test keeps them equal."""

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

#: The daemon's only cluster-scoped rules: read Nodes (its own node's labels, taints, allocatable).
DAEMON_NODE_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
]
