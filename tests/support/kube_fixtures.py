"""Fixtures backed by a real local control plane (etcd + kube-apiserver + kwok).

Tests choose their node by the fixture they ask for:

* ``kube`` (session): a running :class:`LocalCluster` whose only node is simulated by kwok
  (``nymph-node-1``). Without the binaries the tests that use it skip with a message saying how
  to get them, or fail when ``NYMPH_E2E=require`` (CI).
* ``real_kube`` (session): a second control plane carrying a **real node** (containerd +
  kubelet, ``cluster.real_node``) and a kwok node beside it; Pods pinned to the real node really
  run, in the local images (``cluster.node_image_names``). A machine that cannot run it (not
  root, no runc or CNI plugins, no kubelet/containerd built) skips those tests, or fails them
  under ``NYMPH_E2E=require``. Started only when a test asks for it.
* ``real_node_assets`` (session): the same check without starting anything, for tests that start
  their own real-node cluster.
* ``namespace`` / ``real_namespace``: a fresh namespace per test (with its default
  ServiceAccount) in the kwok / real-node cluster.
* ``sa_kubeconfig``: make a ServiceAccount bound to given Role rules and get a kubeconfig that
  authenticates as it (TokenRequest API), to act with exactly those permissions.
* ``kuberay_crds``: the KubeRay CRDs installed and established.

The KubeRay operator on the real node is in tests/support/kuberay_fixtures.py.
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
from nymph.localcluster.cluster import DEFAULT_NODE
from nymph.localcluster.realnode import real_node_support

REPO = Path(__file__).resolve().parents[2]


def _e2e_policy() -> str:
    return os.environ.get("NYMPH_E2E", "auto").strip().lower()


def _skip_or_fail(message: str) -> None:
    if _e2e_policy() == "require":
        pytest.fail(f"NYMPH_E2E=require but {message}", pytrace=False)
    pytest.skip(message)


def _assets() -> Path:
    if _e2e_policy() in ("0", "off", "skip", "no"):
        pytest.skip("real-cluster tests disabled by NYMPH_E2E")
    try:
        return find_assets()
    except AssetsMissing as exc:
        _skip_or_fail(str(exc))
        raise


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path_factory.mktemp("cluster"), assets=_assets(), node="kwok")
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def real_node_assets() -> Path:
    """The assets dir, on a machine that can run a real node (else skip, or fail under
    ``NYMPH_E2E=require``); for tests that start their own real-node cluster."""
    assets = _assets()
    reason = real_node_support(assets)
    if reason is not None:
        _skip_or_fail(f"no real node: {reason}")
    return assets


@pytest.fixture(scope="session")
def real_kube(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, real_node_assets: Path
) -> Iterator[LocalCluster]:
    from tests.support.kuberay_fixtures import real_kube_images, session_needs_ray

    cluster = LocalCluster(
        tmp_path_factory.mktemp("real-cluster"),
        assets=real_node_assets,
        node="real",
        node_names=(DEFAULT_NODE,),
        images=real_kube_images(request.session),
        cluster_dns=session_needs_ray(request.session),
    )
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def new_namespace(cluster: LocalCluster) -> str:
    name = f"t-{secrets.token_hex(4)}"
    cluster.api(
        "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )
    cluster.wait_default_sa(name)
    return name


@pytest.fixture
def namespace(kube: LocalCluster) -> str:
    return new_namespace(kube)


@pytest.fixture
def real_namespace(real_kube: LocalCluster) -> str:
    return new_namespace(real_kube)


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


__all__ = [
    "find_assets",
    "kube",
    "kuberay_crds",
    "namespace",
    "real_kube",
    "real_namespace",
    "real_node_assets",
    "sa_kubeconfig",
    "token_kubeconfig",
]


#: The fixtures that start the local control plane; a test that uses one (directly or through
#: another fixture) is an e2e test, whatever its file says, so ``-m "not e2e"`` never needs one.
CLUSTER_FIXTURES = frozenset({"kube", "real_kube", "real_node_assets"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if (
            CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ()))
            and item.get_closest_marker("e2e") is None
        ):
            item.add_marker(pytest.mark.e2e)
