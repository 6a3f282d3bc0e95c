"""A real local Kubernetes control plane: etcd, kube-apiserver, kube-scheduler,
kube-controller-manager and kwok as local processes (the envtest convention).

Used by the test suite and by ``nymph dev`` when no cluster is reachable. Pods on kwok nodes are
simulated (see ``stages.yaml``); on the real node (containerd + kubelet, see ``realnode.py``)
they run. Everything else (validation, RBAC, watches, deletion) is the real API server.
"""

from nymph.localcluster.assets import AssetsMissing, find_assets
from nymph.localcluster.cluster import LocalCluster

__all__ = ["AssetsMissing", "LocalCluster", "find_assets"]
