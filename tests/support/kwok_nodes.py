"""Extra kwok nodes on the local control plane, and the node ClusterRole for a test's daemons.

A test that needs nodes with their own labels, taints and allocatable makes them here (and
deletes them when it ends); its daemons read their Node with the manifest's read-only node
ClusterRole, bound under a per-test name to the test's ``nymph-daemon`` ServiceAccount.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import yaml

from nymph.errors import NymphError
from nymph.localcluster import LocalCluster
from nymph.localcluster.flags import KWOK_NODE_ANNOTATION
from tests.support.harness import REPO

NODE_READER = REPO / "manifests" / "base" / "daemon-node-reader.yaml"
RBAC = "/apis/rbac.authorization.k8s.io/v1"


def node_manifest(
    name: str,
    *,
    labels: Mapping[str, str],
    taints: Sequence[Mapping[str, str]],
    alloc: Mapping[str, str],
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "type": "kwok", **labels},
        },
        "spec": {"taints": [dict(t) for t in taints]},
        "status": {"allocatable": dict(alloc, pods="110"), "capacity": dict(alloc, pods="110")},
    }


def wait_ready(
    kube: LocalCluster, name: str, taints: Sequence[Mapping[str, str]], timeout: float = 60
) -> None:
    """Wait until Ready, then set the node's taints to exactly ``taints``: the admission plugin
    taints every new node not-ready, and this cluster runs no node lifecycle controller to lift
    it (see LocalCluster._wait_node_ready)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        node = kube.api("GET", f"/api/v1/nodes/{name}")
        conds = node.get("status", {}).get("conditions") or []
        if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds):
            kube.api(
                "PATCH",
                f"/api/v1/nodes/{name}",
                {"spec": {"taints": [dict(t) for t in taints] or None}},
                content_type="application/merge-patch+json",
            )
            return
        time.sleep(0.3)
    raise AssertionError(f"node {name} not Ready in {timeout}s")


@contextlib.contextmanager
def kwok_nodes(kube: LocalCluster, nodes: Sequence[dict[str, Any]]) -> Iterator[None]:
    """Create ``nodes`` (from :func:`node_manifest`), wait until each is Ready with its taints,
    and delete them all when the block ends, pass or fail."""
    made: list[str] = []
    try:
        for node in nodes:
            kube.api("POST", "/api/v1/nodes", node)
            made.append(node["metadata"]["name"])
        for node in nodes:
            wait_ready(kube, node["metadata"]["name"], node["spec"]["taints"])
        yield
    finally:
        for name in made:
            with contextlib.suppress(NymphError):
                kube.api("DELETE", f"/api/v1/nodes/{name}")


@contextlib.contextmanager
def node_reader(kube: LocalCluster, namespace: str) -> Iterator[None]:
    """The manifest's node ClusterRole (under a per-test name), bound to the test's daemon SA,
    removed when the block ends."""
    role, binding = yaml.safe_load_all(NODE_READER.read_text())
    name = f"nymph-daemon-nodes-{namespace}"
    try:
        kube.api("POST", f"{RBAC}/clusterroles", {"metadata": {"name": name}, "rules": role["rules"]})
        kube.api(
            "POST",
            f"{RBAC}/clusterrolebindings",
            {
                "metadata": {"name": name},
                "roleRef": dict(binding["roleRef"], name=name),
                "subjects": [{"kind": "ServiceAccount", "name": "nymph-daemon", "namespace": namespace}],
            },
        )
        yield
    finally:
        for kind in ("clusterrolebindings", "clusterroles"):
            with contextlib.suppress(NymphError):
                kube.api("DELETE", f"{RBAC}/{kind}/{name}")
