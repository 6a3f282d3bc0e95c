"""The cluster ``nymph dev`` runs on: the current kube context when an API server answers, else
the embedded local control plane (a real node when the machine allows it, else kwok), with a
ServiceAccount kubeconfig for the daemon bound to the project's own Role.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from nymph.daemon.rbac import DAEMON_NODE_RULES, DAEMON_ROLE_RULES
from nymph.errors import NymphError
from nymph.kube.binaries import kubectl_path
from nymph.localcluster.assets import find_assets
from nymph.localcluster.cluster import DEFAULT_NODE, LocalCluster, choose_node_kind


@dataclass
class Cluster:
    kubeconfig: str | None
    node: str
    embedded: bool
    local: LocalCluster | None = None
    image: str = "python:3.12-slim"

    @property
    def simulated(self) -> bool:
        return self.local is not None and self.local.node_kind == "kwok"


def reachable_context() -> tuple[str | None, str | None]:
    """(kubeconfig, node) of the current context if an API server answers, else (None, None)."""
    paths = os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    if not any(Path(p).exists() for p in paths.split(os.pathsep) if p):
        return None, None
    try:
        res = subprocess.run(
            [
                kubectl_path(),
                "get",
                "nodes",
                "-o",
                "jsonpath={.items[*].metadata.name}",
                "--request-timeout=4s",
            ],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None, None
    if res.returncode != 0:
        return None, None
    nodes = res.stdout.split()
    return (paths if "KUBECONFIG" in os.environ else None), (nodes[0] if nodes else None)


def server_hosts(cluster: Cluster) -> list[str]:
    """The host of the cluster's API server (the embedded one, or the current context's)."""
    if cluster.local is not None:
        return [cluster.local.api_host]
    paths = cluster.kubeconfig or os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    try:
        res = subprocess.run(
            [kubectl_path(), "config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}"],
            capture_output=True,
            text=True,
            timeout=10,
            env={**os.environ, "KUBECONFIG": paths},
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired, NymphError):
        return []
    host = urllib.parse.urlsplit(res.stdout.strip()).hostname if res.returncode == 0 else None
    return [host] if host else []


def daemon_kubeconfig(local: LocalCluster, state: Path) -> Path:
    """A ServiceAccount bound to the daemon's Role and read-only node ClusterRole: the daemon
    never runs as admin."""
    ns = "default"
    base = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}"
    with contextlib.suppress(NymphError):
        local.api("POST", f"/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": "nymph-daemon"}})
        local.api("POST", f"{base}/roles", {"metadata": {"name": "nymph-daemon"}, "rules": DAEMON_ROLE_RULES})
        local.api(
            "POST",
            f"{base}/rolebindings",
            {
                "metadata": {"name": "nymph-daemon"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "nymph-daemon"},
                "subjects": [{"kind": "ServiceAccount", "name": "nymph-daemon", "namespace": ns}],
            },
        )
    with contextlib.suppress(NymphError):  # read-only Nodes, for node-aware claims
        rbac = "/apis/rbac.authorization.k8s.io/v1"
        name = "nymph-daemon-nodes"
        local.api("POST", f"{rbac}/clusterroles", {"metadata": {"name": name}, "rules": DAEMON_NODE_RULES})
        local.api(
            "POST",
            f"{rbac}/clusterrolebindings",
            {
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": "nymph-daemon", "namespace": ns}],
            },
        )
    tok = local.api(
        "POST",
        f"/api/v1/namespaces/{ns}/serviceaccounts/nymph-daemon/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 86400},
        },
    )
    return local.kubeconfig_for_token(tok["status"]["token"], state / "daemon.kubeconfig", namespace=ns)


@contextlib.contextmanager
def find_cluster(
    state: Path,
    *,
    embedded: bool,
    node: str | None,
    node_kind: str,
    checkpoint: Callable[[], None] | None = None,
    on_stop: Callable[[], None] | None = None,
) -> Iterator[Cluster]:
    """The current kube context when one is reachable (unless ``embedded``), else the embedded
    local control plane under ``state``, stopped when the block ends; ``checkpoint`` and
    ``on_stop`` are the cluster's (see :class:`LocalCluster`)."""
    if not embedded:
        kubeconfig, first = reachable_context()
        if first:
            print(f"      using the current kube context (node {node or first})", file=sys.stderr)
            yield Cluster(kubeconfig=kubeconfig, node=node or first, embedded=False)
            return
        print("      no reachable kube context: starting the embedded cluster", file=sys.stderr)
    kind, _ = choose_node_kind(node_kind, find_assets())  # LocalCluster says which, and why
    cdir = state / "cluster"
    shutil.rmtree(cdir, ignore_errors=True)
    local = LocalCluster(
        cdir,
        node=kind,
        node_names=() if kind == "real" else (DEFAULT_NODE,),
        progress=lambda m: print(f"      {m}", file=sys.stderr, flush=True),
        checkpoint=checkpoint,
        on_stop=on_stop,
    )
    try:
        local.start()
        print(
            f"      embedded cluster ready in {local.start_seconds:.1f}s (admin kubeconfig: {local.kubeconfig})",
            file=sys.stderr,
        )
        kc = daemon_kubeconfig(local, state)
        node_name, image = local.real_node or DEFAULT_NODE, "python:3.12-slim"
        if local.real_node:
            image = next((i for i in local.node_image_names if "/python:" in i), image)
        yield Cluster(kubeconfig=str(kc), node=node_name, embedded=True, local=local, image=image)
    finally:
        local.stop()  # says so (its progress) when something still runs
        for left in local.leftovers:
            print(f"      not cleaned up on this host: {left}", file=sys.stderr)
        if local.leftovers:
            print(
                f"      the next `nymph dev` cleans these up; see {local.workdir} for the logs",
                file=sys.stderr,
            )
