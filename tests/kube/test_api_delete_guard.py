"""The API client deletes a Pod as kubectl does: only a nymph Pod (the reserved label), and
only the one it checked (bound to its uid). The reaper deletes through it in every apply mode."""

from __future__ import annotations

import pytest

from nymph.kube.api import ApiApplier, make_api_client
from nymph.localcluster import LocalCluster

pytestmark = pytest.mark.e2e


def _pod(name: str, labels: dict[str, str]) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "user", "image": "python:3.12-slim"}]},
    }


async def test_api_delete_takes_only_nymph_pods(kube: LocalCluster, namespace: str) -> None:
    base = f"/api/v1/namespaces/{namespace}/pods"
    kube.api("POST", base, _pod("lakeshore-0000aaaa", {"lakeshore": "true"}))
    kube.api("POST", base, _pod("lakeshore-0000bbbb", {"app": "someone-else"}))
    api = await make_api_client(kubeconfig=str(kube.kubeconfig))
    try:
        applier = ApiApplier(api)
        assert await applier.delete_pod(namespace=namespace, name="lakeshore-0000aaaa", grace_seconds=0)
        assert not await applier.delete_pod(namespace=namespace, name="lakeshore-0000bbbb", grace_seconds=0)
        assert not await applier.delete_pod(namespace=namespace, name="lakeshore-0000cccc", grace_seconds=0)
    finally:
        await api.close()
    names = {p["metadata"]["name"] for p in kube.api("GET", base)["items"]}
    assert "lakeshore-0000bbbb" in names and "lakeshore-0000aaaa" not in names


async def test_a_delete_bound_to_a_uid_leaves_a_pod_that_took_the_name_since(
    kube: LocalCluster, namespace: str
) -> None:
    """Given the uid its watch saw, the API client deletes that Pod and no other: a Pod created
    under the same name since (a different uid) stays, even though it carries nymph's label,
    because the client does not read the Pod again to learn its uid."""
    base = f"/api/v1/namespaces/{namespace}/pods"
    name = "lakeshore-0000dddd"
    first = kube.api("POST", base, _pod(name, {"lakeshore": "true"}))
    kube.api("DELETE", f"{base}/{name}", {"gracePeriodSeconds": 0})
    second = kube.api("POST", base, _pod(name, {"lakeshore": "true"}))
    old_uid, new_uid = first["metadata"]["uid"], second["metadata"]["uid"]
    assert old_uid != new_uid
    api = await make_api_client(kubeconfig=str(kube.kubeconfig))
    try:
        applier = ApiApplier(api)
        assert not await applier.delete_pod(namespace=namespace, name=name, grace_seconds=0, uid=old_uid)
        assert kube.api("GET", f"{base}/{name}")["metadata"]["uid"] == new_uid
        assert await applier.delete_pod(namespace=namespace, name=name, grace_seconds=0, uid=new_uid)
    finally:
        await api.close()
    assert name not in {p["metadata"]["name"] for p in kube.api("GET", base)["items"]}
