"""Fixtures backed by a real local control plane (etcd + kube-apiserver + kwok).

* ``kube`` (session): a running :class:`LocalCluster`. Without the binaries the tests that use
  it skip with a message saying how to get them, or fail when ``NYMPH_E2E=require`` (CI).
* ``namespace``: a fresh namespace per test (with its default ServiceAccount).
* ``sa_kubeconfig``: make a ServiceAccount bound to given Role rules and get a kubeconfig that
  authenticates as it (TokenRequest API), to act with exactly those permissions.
* ``kuberay_crds``: the KubeRay CRDs installed and established.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nymph.localcluster import AssetsMissing, LocalCluster, find_assets

REPO = Path(__file__).resolve().parents[1]


def _e2e_policy() -> str:
    return os.environ.get("NYMPH_E2E", "auto").strip().lower()


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    policy = _e2e_policy()
    if policy in ("0", "off", "skip", "no"):
        pytest.skip("real-cluster tests disabled by NYMPH_E2E")
    try:
        assets = find_assets()
    except AssetsMissing as exc:
        if policy == "require":
            pytest.fail(f"NYMPH_E2E=require but {exc}", pytrace=False)
        pytest.skip(str(exc))
    cluster = LocalCluster(tmp_path_factory.mktemp("cluster"), assets=assets)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def namespace(kube: LocalCluster) -> str:
    name = f"t-{secrets.token_hex(4)}"
    kube.api(
        "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )
    kube.wait_default_sa(name)
    return name


SaKubeconfig = Callable[..., Path]


@pytest.fixture
def sa_kubeconfig(kube: LocalCluster, tmp_path: Path) -> SaKubeconfig:
    """``sa_kubeconfig(namespace=, rules=[...], name=)`` -> kubeconfig path for that SA."""

    def make(*, namespace: str, rules: list[dict[str, Any]], name: str = "tester") -> Path:
        ns_api = f"/api/v1/namespaces/{namespace}"
        kube.api("POST", f"{ns_api}/serviceaccounts", {"metadata": {"name": name}})
        rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
        kube.api("POST", f"{rbac}/roles", {"metadata": {"name": name}, "rules": rules})
        kube.api(
            "POST",
            f"{rbac}/rolebindings",
            {
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
            },
        )
        return token_kubeconfig(kube, namespace=namespace, name=name, path=tmp_path / f"{name}.kubeconfig")

    return make


def token_kubeconfig(kube: LocalCluster, *, namespace: str, name: str, path: Path) -> Path:
    resp = kube.api(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 3600},
        },
    )
    return kube.kubeconfig_for_token(resp["status"]["token"], path, namespace=namespace)


def kuberay_crd_dir() -> Path | None:
    candidates = [
        os.environ.get("NYMPH_KUBERAY_CRDS"),
        str(REPO.parent / "shared" / "crds" / "kuberay"),
        "/work/shared/crds/kuberay",
    ]
    for c in candidates:
        if c and (Path(c) / "ray.io_rayjobs.yaml").exists():
            return Path(c)
    return None


@pytest.fixture(scope="session")
def kuberay_crds(kube: LocalCluster) -> Path:
    directory = kuberay_crd_dir()
    if directory is None:
        msg = "KubeRay CRDs not found: set NYMPH_KUBERAY_CRDS to the folder holding ray.io_rayjobs.yaml"
        if _e2e_policy() == "require":
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    for f in ("ray.io_rayclusters.yaml", "ray.io_rayjobs.yaml"):
        kube.kubectl("apply", "--server-side", "--field-manager=nymph-tests", "-f", str(directory / f))
    deadline = time.monotonic() + 60
    for crd in ("rayclusters.ray.io", "rayjobs.ray.io"):
        while True:
            obj = kube.api("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}")
            conds = (obj.get("status") or {}).get("conditions") or []
            if any(c.get("type") == "Established" and c.get("status") == "True" for c in conds):
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"CRD {crd} not established")
            time.sleep(0.2)
    return directory


__all__ = ["find_assets", "kube", "kuberay_crds", "namespace", "sa_kubeconfig", "token_kubeconfig"]
