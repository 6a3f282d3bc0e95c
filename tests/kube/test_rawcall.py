"""Pods created with their manifest encoded once (not through the generated client's model
code) reach the API server exactly as written, with the client's own credentials (a token its
refresh hook renews included), nymph's field manager and a dry run that creates nothing; a
refusal is still the API server's error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client, config

from nymph.kube import pods
from nymph.kube.api import ApiApplier, make_api_client
from nymph.kube.errors import Invalid, Unauthorized
from nymph.kube.kubectl import FIELD_MANAGER
from nymph.localcluster import LocalCluster
from tests.localcluster.test_control_plane import bare_pod
from tests.support.harness import daemon_kubeconfig

pytestmark = pytest.mark.e2e


def _in(namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
    pod["metadata"]["namespace"] = namespace
    return pod


async def test_a_pod_is_created_as_written_with_nymphs_field_manager(
    kube: LocalCluster, namespace: str
) -> None:
    manifest = _in(namespace, bare_pod("written", {"lakeshore": "true"}))
    manifest["metadata"]["annotations"] = {"note": 'caf\u00e9 \u2713 "quoted" \\ back', "big": str(2**62)}
    api = await make_api_client(kubeconfig=str(kube.kubeconfig))
    try:
        applier = ApiApplier(api)
        [dry] = await applier.apply([_in(namespace, bare_pod("dry", {"lakeshore": "true"}))], dry_run=True)
        assert dry.error is None and dry.live() is not None
        [out] = await applier.apply([manifest])
        created = out.live()
        assert out.error is None and created is not None
        # the answer is kept as it came and decoded only when read (a launch never reads it)
        assert out.obj is None and out.body is not None
    finally:
        await api.close()
    names = [p["metadata"]["name"] for p in kube.api("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]]
    assert names == ["written"]  # the dry run created nothing
    got = kube.api("GET", f"/api/v1/namespaces/{namespace}/pods/written")
    assert got["metadata"]["annotations"] == manifest["metadata"]["annotations"]
    assert [m["manager"] for m in got["metadata"]["managedFields"]] == [FIELD_MANAGER]
    assert created["metadata"]["uid"] == got["metadata"]["uid"]


async def test_a_refused_create_is_the_api_servers_error(kube: LocalCluster, namespace: str) -> None:
    bad = _in(namespace, bare_pod("Not_A_Name", {"lakeshore": "true"}))
    api = await make_api_client(kubeconfig=str(kube.kubeconfig))
    try:
        [out] = await ApiApplier(api).apply([bad])
        with pytest.raises(Invalid, match="Not_A_Name"):
            await pods.create_pod(api, bad)
    finally:
        await api.close()
    assert isinstance(out.error, Invalid) and "Not_A_Name" in str(out.error)


async def test_a_token_the_clients_hook_renews_is_the_one_sent(
    kube: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    """As an in-cluster client renews its ServiceAccount token: the hook runs before the
    request, and what it sets is what the API server sees."""
    kubeconfig = daemon_kubeconfig(kube, namespace, tmp_path)
    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    good = cfg.api_key["BearerToken"]
    cfg.api_key["BearerToken"] = "Bearer expired"
    renewed: list[int] = []

    async def renew(c: client.Configuration) -> None:
        renewed.append(1)
        c.api_key["BearerToken"] = good

    cfg.refresh_api_key_hook = renew
    api = client.ApiClient(configuration=cfg)
    try:
        pod, created = await pods.create_pod(api, _in(namespace, bare_pod("renewed", {"lakeshore": "true"})))
    finally:
        await api.close()
    assert created and pod["metadata"]["name"] == "renewed" and renewed
    # and without the hook, the stale token is what is sent: refused
    cfg.refresh_api_key_hook = None
    cfg.api_key["BearerToken"] = "Bearer expired"
    api = client.ApiClient(configuration=cfg)
    try:
        with pytest.raises(Unauthorized):
            await pods.create_pod(api, _in(namespace, bare_pod("stale", {"lakeshore": "true"})))
    finally:
        await api.close()
