"""Writing a root filesystem as a one-layer OCI image-layout archive (a plain tarfile).

The archive holds ``oci-layout``, ``index.json`` (naming the image with the
``org.opencontainers.image.ref.name`` and ``io.containerd.image.name`` annotations), one image
manifest, its config and one layer (gzip by default), and is what
``ctr -n k8s.io images import`` reads. Device nodes, FIFOs and sockets of the rootfs are left
out (the runtime provides /dev); everything else keeps its mode, owner, mtime and links.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import platform
import stat
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"
MEDIA_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
REF_NAME = "org.opencontainers.image.ref.name"
CONTAINERD_NAME = "io.containerd.image.name"
EPOCH = "1970-01-01T00:00:00Z"
_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


@dataclass(frozen=True)
class ImageConfig:
    """The runtime part of an image config (what a container starts with)."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: tuple[str, ...] = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",)
    user: str = ""
    working_dir: str = ""
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str
    size: int

    def to_json(self) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size}


@dataclass(frozen=True)
class WrittenImage:
    """What :func:`write_oci_archive` wrote: the manifest, config and layer descriptors."""

    manifest: Descriptor
    config: Descriptor
    layer: Descriptor
    diff_id: str


class _Sink(Protocol):
    def write(self, data: memoryview, /) -> object: ...


class _HashingWriter(io.RawIOBase):
    """Counts and hashes every byte on its way to ``sink``."""

    def __init__(self, sink: _Sink) -> None:
        super().__init__()
        self._sink = sink
        self.sha = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.size

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._sink.write(view)
        self.sha.update(view)
        self.size += len(view)
        return len(view)

    @property
    def digest(self) -> str:
        return f"sha256:{self.sha.hexdigest()}"


def oci_arch() -> str:
    machine = platform.machine().lower()
    return _ARCH.get(machine, machine)


def _walk(rootfs: Path) -> list[Path]:
    """Every path under ``rootfs`` (not following links), parents before children, sorted."""
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(rootfs, followlinks=False):
        dirnames.sort()
        base = Path(dirpath)
        # os.walk lists symlinks to directories among dirnames but never descends into them
        out.extend(base / n for n in sorted([*dirnames, *filenames]))
    out.sort(key=lambda p: p.relative_to(rootfs).parts)
    return out


def write_layer(rootfs: Path, sink: BinaryIO, *, compress: bool) -> tuple[Descriptor, str]:
    """Tar ``rootfs`` into ``sink``; returns the layer descriptor and the uncompressed diff id."""
    outer = _HashingWriter(sink)
    gz = gzip.GzipFile(fileobj=outer, mode="wb", compresslevel=1, mtime=0) if compress else None
    inner = _HashingWriter(gz) if gz is not None else outer
    with tarfile.open(fileobj=inner, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in _walk(rootfs):
            mode = path.lstat().st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
                continue
            info = tar.gettarinfo(str(path), arcname=path.relative_to(rootfs).as_posix())
            info.uname = info.gname = ""
            if info.isreg():
                with path.open("rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)
    if gz is not None:
        gz.close()
    media = MEDIA_LAYER_GZIP if compress else MEDIA_LAYER
    return Descriptor(media, outer.digest, outer.size), inner.digest


def _blob(data: bytes, media_type: str) -> tuple[Descriptor, bytes]:
    return Descriptor(media_type, f"sha256:{hashlib.sha256(data).hexdigest()}", len(data)), data


def config_json(config: ImageConfig, *, diff_id: str, created: str) -> bytes:
    runtime: dict[str, Any] = {"Env": list(config.env)}
    if config.entrypoint:
        runtime["Entrypoint"] = list(config.entrypoint)
    if config.cmd:
        runtime["Cmd"] = list(config.cmd)
    if config.user:
        runtime["User"] = config.user
    if config.working_dir:
        runtime["WorkingDir"] = config.working_dir
    if config.labels:
        runtime["Labels"] = dict(config.labels)
    doc = {
        "created": created,
        "architecture": oci_arch(),
        "os": "linux",
        "config": runtime,
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": created, "created_by": "nymph.localcluster.oci"}],
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def write_oci_archive(
    *,
    rootfs: Path,
    archive: Path,
    name: str,
    config: ImageConfig,
    compress: bool = True,
    created: str = EPOCH,
) -> WrittenImage:
    """Write ``rootfs`` as the image ``name`` into the OCI archive ``archive`` (overwritten).

    The layer is staged next to ``archive`` and removed afterwards; callers that need the
    archive to appear atomically write into a temporary directory and rename it.
    """
    staged = archive.with_name(archive.name + ".layer")
    try:
        with staged.open("wb") as sink:
            layer, diff_id = write_layer(rootfs, sink, compress=compress)
        cfg, cfg_bytes = _blob(config_json(config, diff_id=diff_id, created=created), MEDIA_CONFIG)
        manifest_doc = {
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": cfg.to_json(),
            "layers": [layer.to_json()],
        }
        man, man_bytes = _blob(json.dumps(manifest_doc, separators=(",", ":")).encode(), MEDIA_MANIFEST)
        index_doc = {
            "schemaVersion": 2,
            "mediaType": MEDIA_INDEX,
            "manifests": [
                {
                    **man.to_json(),
                    "platform": {"architecture": oci_arch(), "os": "linux"},
                    "annotations": {REF_NAME: name, CONTAINERD_NAME: name},
                }
            ],
        }
        with tarfile.open(archive, mode="w", format=tarfile.PAX_FORMAT) as tar:
            _add_bytes(tar, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
            _add_bytes(tar, "index.json", json.dumps(index_doc, separators=(",", ":")).encode())
            for desc, data in ((man, man_bytes), (cfg, cfg_bytes)):
                _add_bytes(tar, blob_path(desc.digest), data)
            tar.add(str(staged), arcname=blob_path(layer.digest), recursive=False)
    finally:
        staged.unlink(missing_ok=True)
    return WrittenImage(manifest=man, config=cfg, layer=layer, diff_id=diff_id)


def blob_path(digest: str) -> str:
    algo, _, hexdigest = digest.partition(":")
    return f"blobs/{algo}/{hexdigest}"
