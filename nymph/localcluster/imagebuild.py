"""Building the nymph image (``daemonset/Dockerfile``) here, without a daemon or a registry.

Debian's buildah builds it on the local python base (``--isolation chroot``, vfs storage in a
throw-away store), and pushes it to an OCI archive in the per-user cache keyed by a hash of
every input (the nymph sources, pyproject.toml, README.md, the Dockerfile and its entrypoint, and
the base image). pip in the build fetches the Python packages; when the host's pip trusts an
extra CA (``PIP_CERT``), that file is mounted into the build and handed to pip.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

import nymph
from nymph.localcluster.images import (
    ARCHIVE,
    ImageBuildError,
    LocalImage,
    cached_archive,
    ensure_python_image,
    progress,
    prune_after_build,
    recipe_key,
    run_step,
)

NYMPH_IMAGE = "nymph.local/nymph:dev"
CONTEXT_FILES = ("pyproject.toml", "README.md", "daemonset/Dockerfile", "daemonset/entrypoint.sh")
KEEP = 3  # nymph images of older sources kept (other checkouts, a branch switched back)
_CA_IN_BUILD = "/run/nymph-build-ca.crt"


def source_root() -> Path:
    """The checkout this nymph was imported from (it holds pyproject.toml and the Dockerfile)."""
    root = Path(nymph.__file__).resolve().parent.parent
    if not all((root / f).is_file() for f in CONTEXT_FILES):
        raise ImageBuildError(
            f"{root} is not a nymph checkout (no {' / '.join(CONTEXT_FILES)}); the image is built from one"
        )
    return root


def context_files(root: Path) -> list[Path]:
    """The build context, relative to ``root``: what the Dockerfile copies, sorted."""
    files = [Path(f) for f in CONTEXT_FILES]
    for path in sorted((root / "nymph").rglob("*")):
        rel = path.relative_to(root)
        if path.is_file() and "__pycache__" not in rel.parts and path.suffix not in (".pyc", ".pyo"):
            files.append(rel)
    return files


def context_digest(root: Path, files: list[Path]) -> str:
    h = hashlib.sha256()
    for rel in files:
        data = (root / rel).read_bytes()
        h.update(f"{rel.as_posix()}\0{len(data)}\0".encode() + data)
    return h.hexdigest()


def _host_pip_cert() -> Path | None:
    value = os.environ.get("PIP_CERT")
    if value and Path(value).is_file():
        return Path(value)
    return None


def ensure_nymph_image(*, root: Path | None = None, source: Path | None = None) -> LocalImage:
    """``nymph.local/nymph:dev`` built from this checkout (a few minutes cold, instant warm)."""
    src = source if source is not None else source_root()
    base = ensure_python_image(root=root)
    files = context_files(src)
    key = recipe_key("nymph-dev", context_digest(src, files), base.oci_archive.parent.name)

    def build(tmp: Path) -> None:
        if os.geteuid() != 0:
            raise ImageBuildError("building the nymph image with buildah needs root")
        if shutil.which("buildah") is None:
            raise ImageBuildError("building the nymph image needs buildah (tests/envtest/deps.sh)")
        work = tmp / "work"
        context = work / "context"
        for rel in files:
            (context / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / rel, context / rel)
        store = [
            "--root",
            str(work / "storage"),
            "--runroot",
            str(work / "run"),
            "--storage-driver",
            "vfs",
        ]
        # buildah's own temporary files (a build's run directory, image copies) go to the scratch
        # space too, so a stopped build leaves nothing in /var/tmp
        (work / "tmp").mkdir()
        env = dict(os.environ, TMPDIR=str(work / "tmp"))
        started = time.monotonic()
        progress(f"building {NYMPH_IMAGE} with buildah on {base.name} (a few minutes the first time)")
        run_step(
            ["buildah", *store, "pull", "--quiet", f"oci-archive:{base.oci_archive}"],
            what="buildah pull of the python base",
            env=env,
        )
        run_step(["buildah", *store, "tag", base.name, base.name], what="buildah tag", env=env)
        bud = [
            "buildah",
            *store,
            "bud",
            "--isolation",
            "chroot",
            "--pull=never",
            "--layers=false",
            "--format",
            "oci",
            "--build-arg",
            f"BASE={base.name}",
            "-f",
            str(context / "daemonset" / "Dockerfile"),
            "-t",
            NYMPH_IMAGE,
        ]
        index = os.environ.get("PIP_INDEX_URL")
        if index:
            bud += ["--build-arg", f"PIP_INDEX_URL={index}"]
        cert = _host_pip_cert()
        if cert is not None:
            bud += ["--volume", f"{cert}:{_CA_IN_BUILD}:ro", "--build-arg", f"PIP_CERT={_CA_IN_BUILD}"]
        run_step([*bud, str(context)], what="buildah bud", log=work / "build.log", timeout=1800, env=env)
        run_step(
            ["buildah", *store, "push", "--quiet", NYMPH_IMAGE, f"oci-archive:{tmp / ARCHIVE}:{NYMPH_IMAGE}"],
            what="buildah push",
            env=env,
        )
        progress(f"built {NYMPH_IMAGE} in {time.monotonic() - started:.0f} s")

    archive = cached_archive(key, build, root=root)
    prune_after_build("nymph-dev", keep=KEEP, root=root)
    return LocalImage(NYMPH_IMAGE, archive)


def _builders() -> dict[str, Callable[[], LocalImage]]:
    from nymph.localcluster.images import ensure_pause_image
    from nymph.localcluster.rayimage import ensure_ray_image

    return {
        "pause": ensure_pause_image,
        "python": ensure_python_image,
        "ray": ensure_ray_image,
        "nymph": ensure_nymph_image,
    }


def _stop(signum: int, _frame: object) -> NoReturn:
    raise SystemExit(128 + signum)  # unwinds the build: its scratch space and mounts are removed


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m nymph.localcluster.imagebuild [NAME ...]``: build (or find) the local images
    named (``pause``, ``python``, ``ray``, ``nymph``; all of them by default) and print one
    ``NAME ARCHIVE`` line each. SIGTERM stops a build and removes what it had written."""
    builders = _builders()
    names = list(sys.argv[1:] if argv is None else argv) or list(builders)
    unknown = [n for n in names if n not in builders]
    if unknown:
        print(f"error: no local image {' '.join(unknown)} (one of {', '.join(builders)})", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _stop)
    try:
        images = [builders[n]() for n in names]
    except ImageBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for image in images:
        print(image.name, image.oci_archive, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
