"""A client built from a kubeconfig leaves none of its certificate or key files behind: the
loader writes them to disk, and a process killed before its exit hooks ran left a client key in
the temp dir for good."""

from __future__ import annotations

import base64
import ssl
import tempfile
from pathlib import Path

import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.config import kube_config

from nymph.kube.api import make_api_client
from nymph.localcluster import LocalCluster

pytestmark = pytest.mark.e2e


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp


def _leftovers(tmp: Path) -> list[str]:
    return sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*"))


async def test_a_client_cert_kubeconfig_leaves_no_file_and_the_client_still_works(
    kube: LocalCluster, private_tmp: Path
) -> None:
    user = yaml.safe_load(kube.kubeconfig.read_text())["users"][0]["user"]
    assert "client-key-data" in user, "the test needs a kubeconfig whose key is inline"
    for _ in range(2):  # the second load must not reuse the paths of files already removed
        api = await make_api_client(kubeconfig=str(kube.kubeconfig))
        try:
            assert _leftovers(private_tmp) == []
            assert not any(v.startswith(str(private_tmp)) for v in kube_config._temp_files.values())
            names = await client.CoreV1Api(api).list_namespace()
            assert "default" in {n.metadata.name for n in names.items}
        finally:
            await api.close()


async def test_a_kubeconfig_that_fails_to_load_leaves_no_file(
    kube: LocalCluster, private_tmp: Path, tmp_path: Path
) -> None:
    data = yaml.safe_load(kube.kubeconfig.read_text())
    # the files are written, then the TLS context refuses a key that is not one
    data["users"][0]["user"]["client-key-data"] = base64.b64encode(b"not a key").decode()
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(ssl.SSLError):
        await make_api_client(kubeconfig=str(bad))
    assert _leftovers(private_tmp) == []
