"""The Ray image of the local node, built here without a registry: what a KubeRay head, worker
and entrypoint need, and nothing more.

A Debian ``minbase`` with python3, ``python`` (entrypoints call it) and ``wget`` (KubeRay's
probes run it), plus a pinned ``ray`` and the wheels its dashboard imports, installed by the
host's pip (``pip install --target``, the host's Python being the image's 3.11 on the same
glibc) into ``/usr/local/lib/python3.11/dist-packages``. Console scripts (``ray``, ...) go to
``/usr/local/bin`` with their shebang pointed at ``/usr/bin/python3``. The libraries no local
test runs (``ray/{rllib,tune,train,serve,data,llm}`` and the Java jars) are left out, so the
image is a few hundred MiB rather than a gigabyte. Ray's usage reports are off
(``RAY_USAGE_STATS_ENABLED=0``): nothing a head runs here tries to leave the machine. The cache
key names the Ray version, the wheel list and the environment, so changing any builds a new
image.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from nymph.localcluster.images import (
    ARCHIVE,
    BASE_ENV,
    PYTHON_SUITE,
    ImageBuildError,
    LocalImage,
    cached_archive,
    debootstrap_rootfs,
    progress,
    prune_after_build,
    recipe_key,
    run_step,
)
from nymph.localcluster.oci import ImageConfig, write_oci_archive

RAY_VERSION = "2.60.0"
RAY_IMAGE = f"nymph.local/ray:{RAY_VERSION}"
PYTHON_MINOR = (3, 11)  # bookworm's python3
DEBIAN_PACKAGES = ("python3", "python-is-python3", "wget", "ca-certificates")
# ray[default] without what a local head never uses (py-spy, smart_open, virtualenv, colorful)
WHEELS = (
    f"ray=={RAY_VERSION}",
    "aiohttp==3.14.5",
    "aiohttp_cors==0.8.1",
    "grpcio==1.85.3",
    "opencensus==0.11.4",
    "opentelemetry-sdk==1.45.2",
    "opentelemetry-exporter-prometheus==0.66b2",
    "opentelemetry-proto==1.45.2",
    "prometheus_client==0.26.0",
    "pydantic==2.14.4",
    "requests==2.34.2",
)
#: no usage report to the Ray project (nothing leaves this machine), unbuffered driver output
ENV = ("RAY_USAGE_STATS_ENABLED=0", "PYTHONUNBUFFERED=1")
STRIPPED = ("rllib", "tune", "train", "serve", "data", "llm", "jars")
SITE = "usr/local/lib/python3.11/dist-packages"
KEEP = 2  # Ray images of older recipes kept


def _pip_install(site: Path, *, log: Path) -> None:
    if sys.version_info[:2] != PYTHON_MINOR:
        raise ImageBuildError(
            f"the Ray image installs wheels with the host's Python, which must be "
            f"{PYTHON_MINOR[0]}.{PYTHON_MINOR[1]} like {PYTHON_SUITE}'s (this one is "
            f"{sys.version_info[0]}.{sys.version_info[1]})"
        )
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-input", "--target", str(site)]
    cmd += ["--only-binary=:all:", "--no-warn-script-location", *WHEELS]
    run_step(cmd, what="pip install of the Ray wheels", log=log, timeout=1800)


def _scripts_to_bin(site: Path, bindir: Path) -> None:
    """Move pip's ``<target>/bin`` scripts to ``bindir``, run by the image's own python3."""
    scripts = site / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    if not scripts.is_dir():
        return
    for script in sorted(scripts.iterdir()):
        data = script.read_bytes()
        if data.startswith(b"#!"):
            _, _, rest = data.partition(b"\n")
            data = b"#!/usr/bin/python3\n" + rest
        target = bindir / script.name
        target.write_bytes(data)
        target.chmod(0o755)
    shutil.rmtree(scripts)


def strip_ray(site: Path) -> int:
    """Remove the Ray libraries no local test imports; returns the bytes freed."""
    freed = 0
    for name in STRIPPED:
        path = site / "ray" / name
        if path.is_dir():
            freed += sum(f.lstat().st_size for f in path.rglob("*") if f.is_file())
            shutil.rmtree(path)
    return freed


def ensure_ray_image(*, root: Path | None = None, mirror: str | None = None) -> LocalImage:
    """``nymph.local/ray:<RAY_VERSION>`` (about 4 minutes cold on two cores, instant warm)."""

    def build(tmp: Path) -> None:
        started = time.monotonic()
        rootfs = tmp / "work" / "rootfs"
        debootstrap_rootfs(rootfs, packages=DEBIAN_PACKAGES, what="ray", mirror=mirror)
        site = rootfs / SITE
        progress(f"installing ray {RAY_VERSION} and {len(WHEELS) - 1} wheels into the image")
        _pip_install(site, log=tmp / "work" / "pip.log")
        _scripts_to_bin(site, rootfs / "usr" / "local" / "bin")
        freed = strip_ray(site)
        if not (rootfs / "usr" / "local" / "bin" / "ray").is_file():
            raise ImageBuildError("the Ray wheels installed no ray console script")
        progress(f"left out {freed >> 20} MiB of Ray libraries; writing {RAY_IMAGE}")
        config = ImageConfig(cmd=("/bin/bash",), env=(*BASE_ENV, *ENV))
        write_oci_archive(rootfs=rootfs, archive=tmp / ARCHIVE, name=RAY_IMAGE, config=config)
        progress(f"built {RAY_IMAGE} in {time.monotonic() - started:.0f} s")

    key = recipe_key("ray", PYTHON_SUITE, *DEBIAN_PACKAGES, *WHEELS, *STRIPPED, SITE, *ENV)
    archive = cached_archive(key, build, root=root)
    prune_after_build("ray", keep=KEEP, root=root)
    return LocalImage(RAY_IMAGE, archive)


def main() -> int:
    """``python -m nymph.localcluster.rayimage``: build (or find) the Ray image, print its archive."""
    try:
        image = ensure_ray_image()
    except ImageBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(image.name, image.oci_archive)
    return 0


if __name__ == "__main__":
    sys.exit(main())
