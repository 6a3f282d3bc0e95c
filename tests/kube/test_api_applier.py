"""The ``api`` applier's delete is as careful as kubectl's: nymph Pods only, the one it read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nymph.kube.api import ApiApplier, make_api_client
from nymph.kube.errors import Forbidden, Invalid
from nymph.localcluster import LocalCluster
from tests.localcluster.test_control_plane import bare_pod
from tests.support.harness import daemon_kubeconfig
from tests.support.kube_fixtures import new_namespace

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


def _in(namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
    pod["metadata"]["namespace"] = namespace
    return pod


async def test_api_apply_and_delete_report_what_the_api_server_refused(
    kube: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    """Read and answered raw (no client models): a refusal is still an error that quotes the
    API server, never a silent "there was no Pod" or a Pod that seemed applied."""
    other = new_namespace(kube)
    kube.api("POST", f"/api/v1/namespaces/{other}/pods", bare_pod("ours", {"lakeshore": "true"}))
    # the daemon's own identity, bound in ``namespace`` only
    api = await make_api_client(kubeconfig=str(daemon_kubeconfig(kube, namespace, tmp_path)))
    try:
        applier = ApiApplier(api)
        with pytest.raises(Forbidden, match="forbidden"):
            await applier.delete_pod(namespace=other, name="ours", grace_seconds=0)
        assert _exists(kube, other, "ours")
        [refused] = await applier.apply([_in(other, bare_pod("p", {"lakeshore": "true"}))])
        assert (
            isinstance(refused.error, Forbidden)
            and "forbidden" in str(refused.error)
            and refused.live() is None
        )
        [applied] = await applier.apply([_in(namespace, bare_pod("p", {"lakeshore": "true"}))])
        created = applied.live()
        assert applied.error is None and created is not None
        assert created["metadata"]["name"] == "p" and created["metadata"]["uid"]
    finally:
        await api.close()
