"""The OCI archive writer on a tiny rootfs: members, digests and sizes match the manifest."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest

from nymph.localcluster.oci import (
    CONTAINERD_NAME,
    MEDIA_CONFIG,
    MEDIA_LAYER,
    MEDIA_LAYER_GZIP,
    MEDIA_MANIFEST,
    REF_NAME,
    ImageConfig,
    blob_path,
    oci_arch,
    write_oci_archive,
)


def _rootfs(root: Path) -> Path:
    rootfs = root / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    (rootfs / "etc").mkdir()
    (rootfs / "empty").mkdir()
    tool = rootfs / "bin" / "tool"
    tool.write_bytes(b"#!/bin/sh\necho hi\n")
    tool.chmod(0o755)
    (rootfs / "etc" / "motd").write_text("héllo\n", encoding="utf-8")
    (rootfs / "etc" / "motd").chmod(0o600)
    os.link(tool, rootfs / "bin" / "tool2")
    (rootfs / "bin" / "sh").symlink_to("tool")
    (rootfs / "lib").symlink_to("bin")  # a symlink to a directory is kept, not followed
    os.mkfifo(rootfs / "etc" / "fifo")  # left out: the runtime provides such things
    return rootfs


def _sha(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def _read(tar: tarfile.TarFile, name: str) -> bytes:
    fh = tar.extractfile(name)
    assert fh is not None, name
    return fh.read()


def _open(archive: Path) -> tuple[dict[str, bytes], dict[str, Any], dict[str, Any], dict[str, Any]]:
    with tarfile.open(archive) as tar:
        blobs = {m.name: _read(tar, m.name) for m in tar.getmembers() if m.isfile()}
    index = json.loads(blobs["index.json"])
    manifest_desc = index["manifests"][0]
    manifest = json.loads(blobs[blob_path(manifest_desc["digest"])])
    config = json.loads(blobs[blob_path(manifest["config"]["digest"])])
    return blobs, index, manifest, config


@pytest.mark.parametrize("compress", [True, False])
def test_archive_members_digests_and_sizes_match(tmp_path: Path, compress: bool) -> None:
    rootfs = _rootfs(tmp_path)
    archive = tmp_path / "image.tar"
    cfg = ImageConfig(entrypoint=("/bin/tool",), cmd=("x",), env=("A=1",), user="65535")
    written = write_oci_archive(
        rootfs=rootfs, archive=archive, name="nymph.local/tiny:1", config=cfg, compress=compress
    )
    blobs, index, manifest, config = _open(archive)

    assert json.loads(blobs["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    # every blob is stored under its own digest, and nothing else is in the archive
    for name, data in blobs.items():
        if name.startswith("blobs/"):
            assert name == blob_path(_sha(data))
    assert set(blobs) == {
        "oci-layout",
        "index.json",
        blob_path(written.manifest.digest),
        blob_path(written.config.digest),
        blob_path(written.layer.digest),
    }

    (desc,) = index["manifests"]
    assert desc["mediaType"] == MEDIA_MANIFEST
    assert desc["annotations"] == {REF_NAME: "nymph.local/tiny:1", CONTAINERD_NAME: "nymph.local/tiny:1"}
    assert desc["platform"] == {"architecture": oci_arch(), "os": "linux"}
    man_bytes = blobs[blob_path(desc["digest"])]
    assert desc["size"] == len(man_bytes) and desc["digest"] == _sha(man_bytes)

    assert manifest["config"]["mediaType"] == MEDIA_CONFIG
    cfg_bytes = blobs[blob_path(manifest["config"]["digest"])]
    assert manifest["config"]["size"] == len(cfg_bytes)
    (layer_desc,) = manifest["layers"]
    layer = blobs[blob_path(layer_desc["digest"])]
    assert layer_desc["size"] == len(layer) and layer_desc["digest"] == _sha(layer)
    assert layer_desc["mediaType"] == (MEDIA_LAYER_GZIP if compress else MEDIA_LAYER)

    plain = gzip.decompress(layer) if compress else layer
    assert config["rootfs"] == {"type": "layers", "diff_ids": [_sha(plain)]}
    assert written.diff_id == _sha(plain)
    assert config["config"]["Entrypoint"] == ["/bin/tool"]
    assert config["config"]["Cmd"] == ["x"]
    assert config["config"]["Env"] == ["A=1"]
    assert config["config"]["User"] == "65535"
    assert config["os"] == "linux" and config["architecture"] == oci_arch()


def test_layer_holds_the_rootfs(tmp_path: Path) -> None:
    rootfs = _rootfs(tmp_path)
    archive = tmp_path / "image.tar"
    write_oci_archive(rootfs=rootfs, archive=archive, name="tiny:1", config=ImageConfig())
    blobs, _, manifest, _ = _open(archive)
    layer = gzip.decompress(blobs[blob_path(manifest["layers"][0]["digest"])])
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert list(members) == [
            "bin",
            "bin/sh",
            "bin/tool",
            "bin/tool2",
            "empty",
            "etc",
            "etc/motd",
            "lib",
        ]
        assert _read(tar, "bin/tool") == b"#!/bin/sh\necho hi\n"
        assert members["bin/tool"].mode == 0o755
        assert members["etc/motd"].mode == 0o600
        assert _read(tar, "etc/motd").decode() == "héllo\n"
        assert members["bin/sh"].issym() and members["bin/sh"].linkname == "tool"
        assert members["lib"].issym() and members["lib"].linkname == "bin"
        assert members["bin/tool2"].islnk() and members["bin/tool2"].linkname == "bin/tool"
        assert members["empty"].isdir()
    # the staged layer file next to the archive is gone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["image.tar", "rootfs"]


def test_same_rootfs_same_digests(tmp_path: Path) -> None:
    rootfs = _rootfs(tmp_path)
    first = write_oci_archive(rootfs=rootfs, archive=tmp_path / "a.tar", name="t:1", config=ImageConfig())
    second = write_oci_archive(rootfs=rootfs, archive=tmp_path / "b.tar", name="t:1", config=ImageConfig())
    assert first == second
