"""The images a real local node needs, built here without a registry and cached by version.

``ensure_images()`` returns the local ``pause`` image (a static C program that sleeps until
SIGTERM/SIGINT and reaps children) and a ``python:3`` image (``debootstrap --variant=minbase``
of Debian bookworm from the machine's own apt mirror), each as a one-layer OCI archive under
``<cache>/images/<key>/image.tar``. A key names the recipe, so a second call returns at once;
builds go to a temporary directory renamed into place, under a lock, so a killed build never
leaves a half image and two processes never build the same one. ``import_images()`` loads the
archives into a containerd with ``ctr``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from nymph.errors import NymphError
from nymph.localcluster.assets import cache_root
from nymph.localcluster.oci import ImageConfig, write_oci_archive
from nymph.localcluster.procs import pid_alive

PAUSE_IMAGE = "nymph.local/pause:3.10"
PYTHON_IMAGE = "nymph.local/python:3-bookworm"
PYTHON_SUITE = "bookworm"
# python3-minimal lacks urllib.request; python3-venv brings ensurepip, so images built on this
# base can make a venv (Debian's python refuses a system-wide pip install, PEP 668).
PYTHON_PACKAGES = ("python3", "python3-venv")
ARCHIVE = "image.tar"
APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))
_RECIPE = "1"  # bump when a recipe below changes in a way its inputs do not show

PAUSE_C = r"""
#include <signal.h>
#include <stddef.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, NULL, WNOHANG) > 0) {} }

int main(void) {
    struct sigaction term = {0}, child = {0};
    term.sa_handler = stop;
    sigaction(SIGINT, &term, NULL);
    sigaction(SIGTERM, &term, NULL);
    child.sa_handler = reap;
    child.sa_flags = SA_NOCLDSTOP | SA_RESTART;
    sigaction(SIGCHLD, &child, NULL);
    for (;;) pause();
}
"""


class ImageBuildError(NymphError):
    """A local image could not be built or imported."""


@dataclass(frozen=True)
class LocalImage:
    """An image built here: its reference and the OCI archive holding it."""

    name: str
    oci_archive: Path


def images_dir() -> Path:
    return cache_root() / "images"


def progress(message: str) -> None:
    print(f"images: {message}", file=sys.stderr, flush=True)


def recipe_key(prefix: str, *parts: bytes | str) -> str:
    h = hashlib.sha256(_RECIPE.encode())
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "big") + data)
    return f"{prefix}-{h.hexdigest()[:12]}"


# --- cache: lock, atomic publish, safe removal -------------------------------------------------


def mounts_under(path: Path) -> list[Path]:
    """Mount points at or below ``path`` (deepest first), from /proc/self/mountinfo."""
    base = os.path.realpath(path)
    found: list[Path] = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo", encoding="utf-8") as fh:
        for line in fh:
            point = line.split(" ")[4].replace("\\040", " ")
            if point == base or point.startswith(base + "/"):
                found.append(Path(point))
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def remove_tree(path: Path) -> None:
    """Remove ``path`` after detaching anything mounted below it (a killed debootstrap leaves
    /proc, /sys or /dev mounts in its target; rmtree must never walk into those)."""
    if not path.exists():
        return
    for point in mounts_under(path):
        subprocess.run(["umount", "--lazy", str(point)], capture_output=True, check=False)
    left = mounts_under(path)
    if left:
        raise ImageBuildError(f"cannot remove {path}: still mounted at {left[0]}")
    shutil.rmtree(path)


@contextlib.contextmanager
def _locked(lock: Path) -> Iterator[None]:
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"waiting for another process building {lock.stem.lstrip('.')}")
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def cached_archive(key: str, build: Callable[[Path], None], *, root: Path | None = None) -> Path:
    """``<root>/<key>/image.tar``, built first by ``build(tmp)`` if missing.

    ``build`` writes ``tmp / "image.tar"`` and may use ``tmp / "work"`` as scratch space; the
    scratch is removed and ``tmp`` renamed to ``<key>`` only when ``build`` returns.
    """
    base = root if root is not None else images_dir()
    final = base / key / ARCHIVE
    if final.is_file():
        with contextlib.suppress(OSError):
            os.utime(final.parent)  # last used: what prune() keeps
        return final
    with _locked(base / f".{key}.lock"):
        if final.is_file():
            return final
        for stale in base.glob(f".tmp-{key}-*"):  # a build killed before it could clean up
            remove_tree(stale)
        tmp = base / f".tmp-{key}-{os.getpid()}"
        tmp.mkdir(parents=True)
        try:
            build(tmp)
            if not (tmp / ARCHIVE).is_file():
                raise ImageBuildError(f"building {key} wrote no {ARCHIVE}")
            remove_tree(tmp / "work")
            if (base / key).exists():  # an incomplete directory from an older layout
                remove_tree(base / key)
            os.rename(tmp, base / key)
        finally:
            remove_tree(tmp)
    return final


def prune(prefix: str, *, keep: int, root: Path | None = None) -> list[Path]:
    """Remove all but the ``keep`` most recent ``<prefix>-*`` images (older source versions).

    Processes that build at once (a test run's workers) prune at once: each old image is first
    renamed out of the way, which only one of them can do, and removed by that one; an image
    another one took meanwhile is left to it. What a killed prune left behind goes too."""
    base = root if root is not None else images_dir()
    found: list[tuple[float, Path]] = []
    for p in base.glob(f"{prefix}-*"):
        with contextlib.suppress(FileNotFoundError):  # another process pruned it meanwhile
            st = p.stat()
            if stat.S_ISDIR(st.st_mode):
                found.append((st.st_mtime, p))
    found.sort(key=lambda item: item[0], reverse=True)
    removed = []
    for _, old in found[keep:]:
        doomed = base / f".pruned-{old.name}-{os.getpid()}"
        try:
            os.rename(old, doomed)
        except FileNotFoundError:
            continue
        remove_tree(doomed)
        (base / f".{old.name}.lock").unlink(missing_ok=True)
        removed.append(old)
    for left in base.glob(f".pruned-{prefix}-*"):
        pid = left.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not pid_alive(int(pid)):
            with contextlib.suppress(FileNotFoundError):
                remove_tree(left)
    return removed


def prune_after_build(prefix: str, *, keep: int, root: Path | None = None) -> None:
    """:func:`prune` once an image is built: an old image that cannot be removed now (still
    mounted, a disk error) is said and left for the next build; the new image is ready anyway."""
    try:
        prune(prefix, keep=keep, root=root)
    except (OSError, ImageBuildError) as exc:
        progress(f"old {prefix} images not removed ({exc}); the next build tries again")


def run_step(
    cmd: Sequence[str],
    *,
    what: str,
    log: Path | None = None,
    timeout: float = 900,
    env: Mapping[str, str] | None = None,
) -> None:
    environ = None if env is None else dict(env)
    try:
        if log is None:
            done = subprocess.run(
                list(cmd), capture_output=True, text=True, timeout=timeout, check=False, env=environ
            )
            returncode, output = done.returncode, done.stdout + done.stderr
        else:
            with log.open("w") as out:
                returncode = subprocess.run(
                    list(cmd), stdout=out, stderr=subprocess.STDOUT, timeout=timeout, check=False, env=environ
                ).returncode
            output = log.read_text(errors="replace")
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ImageBuildError(f"{what} failed: {exc}") from exc
    if returncode != 0:
        tail = "\n".join(output.strip().splitlines()[-15:])
        raise ImageBuildError(f"{what} failed (exit {returncode}):\n{tail}")


# --- pause ------------------------------------------------------------------------------------


def ensure_pause_image(*, root: Path | None = None) -> LocalImage:
    """``nymph.local/pause:3.10``: a static pause binary, the sandbox image of the local node."""

    def build(tmp: Path) -> None:
        progress(f"building {PAUSE_IMAGE}")
        if shutil.which("gcc") is None:
            raise ImageBuildError("building the pause image needs gcc (tests/envtest/deps.sh)")
        rootfs = tmp / "work" / "rootfs"
        rootfs.mkdir(parents=True)
        src = tmp / "work" / "pause.c"
        src.write_text(PAUSE_C)
        run_step(["gcc", "-static", "-Os", "-s", "-o", str(rootfs / "pause"), str(src)], what="gcc -static")
        config = ImageConfig(entrypoint=("/pause",), user="65535:65535")
        write_oci_archive(rootfs=rootfs, archive=tmp / ARCHIVE, name=PAUSE_IMAGE, config=config)

    key = recipe_key("pause-3.10", PAUSE_C)
    return LocalImage(PAUSE_IMAGE, cached_archive(key, build, root=root))


# --- python (debootstrap) ---------------------------------------------------------------------


def parse_apt_sources(text: str, *, deb822: bool) -> list[tuple[str, list[str]]]:
    """``(uri, suites)`` of each enabled binary (``deb``) source in one apt sources file."""
    found: list[tuple[str, list[str]]] = []
    if not deb822:
        for raw in text.splitlines():
            line = re.sub(r"\[[^\]]*\]", " ", raw.split("#", 1)[0]).split()
            if len(line) >= 3 and line[0] == "deb":
                found.append((line[1], [line[2]]))
        return found
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for raw in stanza.splitlines():
            if raw.startswith("#") or ":" not in raw or raw[:1].isspace():
                continue
            name, _, value = raw.partition(":")
            fields[name.strip().lower()] = value.strip()
        if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes").lower() == "no":
            continue
        suites = fields.get("suites", "").split()
        found.extend((uri, suites) for uri in fields.get("uris", "").split())
    return found


def debian_mirror(*, sources: Sequence[Path] = APT_SOURCES) -> str:
    """The machine's Debian archive (a source with a plain release suite, not -security/-updates)."""
    files: list[Path] = []
    for path in sources:
        if path.is_dir():
            files.extend(sorted(p for p in path.iterdir() if p.suffix in (".list", ".sources")))
        elif path.is_file():
            files.append(path)
    for file in files:
        try:
            text = file.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for uri, suites in parse_apt_sources(text, deb822=file.suffix == ".sources"):
            plain = [s for s in suites if "-" not in s and "/" not in s]
            if plain and re.match(r"^(https?|file)://", uri):
                return uri
    raise ImageBuildError(
        "no Debian archive found in the apt sources (/etc/apt/sources.list*); the python image "
        "is built with debootstrap from the machine's own mirror"
    )


def debootstrap_rootfs(
    rootfs: Path, *, packages: Sequence[str], what: str, mirror: str | None = None
) -> None:
    """A Debian ``minbase`` of :data:`PYTHON_SUITE` with ``packages`` at ``rootfs`` (needs root and
    debootstrap; ``rootfs.parent`` holds its log), without apt's caches or logs."""
    if os.geteuid() != 0:
        raise ImageBuildError(f"building the {what} image runs debootstrap, which needs root")
    if shutil.which("debootstrap") is None:
        raise ImageBuildError(f"building the {what} image needs debootstrap (tests/envtest/deps.sh)")
    source = mirror or debian_mirror()
    rootfs.parent.mkdir(parents=True, exist_ok=True)
    progress(f"debootstrap {PYTHON_SUITE} for the {what} image (about a minute)")
    started = time.monotonic()
    include = ",".join(packages)
    cmd = ["debootstrap", "--variant=minbase", f"--include={include}", PYTHON_SUITE, str(rootfs), source]
    run_step(cmd, what="debootstrap", log=rootfs.parent / "debootstrap.log", timeout=1800)
    for point in mounts_under(rootfs):
        subprocess.run(["umount", "--lazy", str(point)], capture_output=True, check=False)
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists", "var/log"):
        for entry in (rootfs / junk).glob("*"):
            if entry.is_file() and not entry.is_symlink():
                entry.unlink()
    progress(f"debootstrap done in {time.monotonic() - started:.0f} s")


BASE_ENV = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8")


def ensure_python_image(*, root: Path | None = None, mirror: str | None = None) -> LocalImage:
    """``nymph.local/python:3-bookworm``: a Debian minbase with python3 (about 40 s, once)."""

    def build(tmp: Path) -> None:
        rootfs = tmp / "work" / "rootfs"
        debootstrap_rootfs(rootfs, packages=PYTHON_PACKAGES, what="python", mirror=mirror)
        progress(f"writing {PYTHON_IMAGE} as an OCI archive")
        config = ImageConfig(cmd=("python3",), env=BASE_ENV)
        write_oci_archive(rootfs=rootfs, archive=tmp / ARCHIVE, name=PYTHON_IMAGE, config=config)

    key = recipe_key("python-3-bookworm", PYTHON_SUITE, *PYTHON_PACKAGES)
    return LocalImage(PYTHON_IMAGE, cached_archive(key, build, root=root))


def ensure_images(*, root: Path | None = None) -> list[LocalImage]:
    """The pause and python images, built once per recipe into the per-user cache."""
    return [ensure_pause_image(root=root), ensure_python_image(root=root)]


def import_images(
    *,
    images: Sequence[LocalImage],
    ctr: Path,
    address: Path,
    namespace: str = "k8s.io",
    snapshotter: str | None = None,
) -> None:
    """Load each archive into the containerd listening on ``address`` (``ctr images import``)."""
    for image in images:
        cmd = [str(ctr), "--address", str(address), "--namespace", namespace, "images", "import"]
        if snapshotter:
            cmd += ["--snapshotter", snapshotter]
        cmd.append(str(image.oci_archive))
        started = time.monotonic()
        run_step(cmd, what=f"importing {image.name}", timeout=600)
        progress(f"imported {image.name} in {time.monotonic() - started:.1f} s")
