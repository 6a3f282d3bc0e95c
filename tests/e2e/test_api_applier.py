"""The ``api`` applier's delete is as careful as kubectl's: nymph Pods only, the one it read."""

from __future__ import annotations

import pytest

from nymph.kube.api import ApiApplier, make_api_client
from nymph.kube.errors import Invalid
from nymph.localcluster import LocalCluster
from tests.e2e.test_control_plane import bare_pod

pytestmark = pytest.mark.e2e


def _exists(kube: LocalCluster, namespace: str, name: str) -> bool:
    pods = kube.api("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]
    return any(p["metadata"]["name"] == name and not p["metadata"].get("deletionTimestamp") for p in pods)


async def test_api_delete_removes_a_nymph_pod_and_never_another(kube: LocalCluster, namespace: str) -> None:
    kube.api("POST", f"/api/v1/namespaces/{namespace}/pods", bare_pod("not-ours", {"app": "x"}))
    kube.api("POST", f"/api/v1/namespaces/{namespace}/pods", bare_pod("ours", {"lakeshore": "true"}))
    api = await make_api_client(kubeconfig=str(kube.kubeconfig))
    try:
        applier = ApiApplier(api)
        assert await applier.delete_pod(namespace=namespace, name="not-ours", grace_seconds=0) is False
        assert _exists(kube, namespace, "not-ours"), "a Pod without nymph's label was deleted"
        assert await applier.delete_pod(namespace=namespace, name="ours", grace_seconds=0) is True
        assert not _exists(kube, namespace, "ours")
        assert await applier.delete_pod(namespace=namespace, name="never-was", grace_seconds=0) is False
        for name, ns in (
            ("--all", namespace),
            ("a,b", namespace),
            ("ours", "--all-namespaces"),
            ("", namespace),
        ):
            with pytest.raises(Invalid, match="refusing to delete"):
                await applier.delete_pod(namespace=ns, name=name, grace_seconds=None)
        assert _exists(kube, namespace, "not-ours")
    finally:
        await api.close()
