"""Local images built in the background, for the sessions whose tests need them.

A session that collects a test using one of :data:`NEEDED_BY` (directly or through another
fixture) starts that image's build when collection ends, beside the tests that run before the
first one needing it: ``python -m nymph.localcluster.imagebuild NAME``, niced, in its own
process group (:func:`nymph.localcluster.procs.spawn`), so its cache key is the one the build
computes (for the nymph image: this checkout's sources) and a warm cache answers at once. The
fixture that needs the image waits for it (:meth:`BackgroundBuild.result`: a failed build fails
it with the end of the build's log). A session that ends first stops the build (SIGTERM, which
unwinds it: scratch space and mounts removed; SIGKILL after a grace) and removes whatever it
left.

* ``nymph_image`` (session): ``nymph.local/nymph:dev`` built from this checkout.
* ``nymph_image_on_node`` (session): that image imported into ``real_kube``'s node, once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from nymph.localcluster import LocalCluster
from nymph.localcluster.images import (
    ImageBuildError,
    LocalImage,
    images_dir,
    import_images,
    progress,
    remove_tree,
)
from nymph.localcluster.procs import Proc, spawn, stop_all

REPO = Path(__file__).resolve().parents[2]
#: image -> the fixture whose tests need it (``kuberay_operator``: tests/support/kuberay_fixtures.py)
NEEDED_BY = {"ray": "kuberay_operator", "nymph": "nymph_image"}
STOP_GRACE = 30.0  # a stopped build removes its scratch space (a few hundred MiB) before it exits
LOG_TAIL = 25


@dataclass
class BackgroundBuild:
    image: str
    proc: Proc
    logdir: Path
    started: float

    @classmethod
    def start(cls, image: str, argv: Sequence[str] | None = None) -> BackgroundBuild:
        """``python -m nymph.localcluster.imagebuild IMAGE`` (or ``argv``) started now, on this
        checkout's nymph, its output in a log of its own."""
        logdir = Path(tempfile.mkdtemp(prefix=f"nymph-{image}-image-"))
        path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        # niced: the tests that run meanwhile keep the cores they need
        cmd = argv or ["nice", "-n", "10", sys.executable, "-m", "nymph.localcluster.imagebuild", image]
        proc = spawn(f"build-{image}", cmd, logdir=logdir, env=dict(os.environ, PYTHONPATH=path))
        return cls(image, proc, logdir, time.monotonic())

    def done(self) -> bool:
        return self.proc.popen.poll() is not None

    def wait(self, timeout: float | None = None) -> bool:
        """Whether the build has ended within ``timeout`` seconds."""
        try:
            self.proc.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def result(self) -> LocalImage:
        """The built image, once the build ends; ImageBuildError with its log's end if it failed."""
        waiting = time.monotonic()
        code = self.proc.popen.wait()
        lines = (
            self.proc.log.read_text(errors="replace").strip().splitlines() if self.proc.log.exists() else []
        )
        if code != 0 or not lines or len(lines[-1].split(" ")) != 2:
            tail = "\n".join(lines[-LOG_TAIL:])
            raise ImageBuildError(
                f"building the {self.image} image (python -m nymph.localcluster.imagebuild {self.image}) "
                f"failed with exit {code}; the end of its log:\n{tail}"
            )
        now = time.monotonic()
        progress(
            f"{self.image} image: waited {now - waiting:.1f} s for its build, {now - self.started:.1f} s after it started"
        )
        name, archive = lines[-1].split(" ")
        return LocalImage(name, Path(archive))

    def stop(self) -> None:
        """Stop the build if it runs, then remove what it left: its log and any scratch space."""
        stop_all([self.proc], grace=STOP_GRACE)
        for scratch in images_dir().glob(f".tmp-*-{self.proc.popen.pid}"):
            remove_tree(scratch)
        shutil.rmtree(self.logdir, ignore_errors=True)


_BUILDS: dict[str, BackgroundBuild] = {}


def session_needs(session: pytest.Session, image: str) -> bool:
    """Whether a collected test asks for the fixture that needs ``image``."""
    fixture = NEEDED_BY[image]
    return any(fixture in getattr(item, "fixturenames", ()) for item in session.items)


def build_of(image: str) -> BackgroundBuild:
    """The build of ``image`` in this session: the one started at collection, else one started now."""
    if image not in _BUILDS:
        _BUILDS[image] = BackgroundBuild.start(image)
    return _BUILDS[image]


def started(image: str) -> BackgroundBuild | None:
    return _BUILDS.get(image)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start each image's build (seconds to minutes) as soon as the session is known to need it."""
    if os.geteuid() != 0 or session.config.option.collectonly:  # the fixtures report a missing root
        return
    for image in NEEDED_BY:
        if session_needs(session, image):
            build_of(image)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """A build the session no longer needs (it ended early) is stopped and cleaned up, before the
    check that no process of the run is left."""
    while _BUILDS:
        _BUILDS.popitem()[1].stop()


def import_into_node(kube: LocalCluster, image: LocalImage) -> None:
    """Load ``image`` into the real node of ``kube`` unless the node started with it."""
    if image.name in kube.node_image_names:
        return
    assert kube.real is not None and kube.real.layout is not None
    import_images(
        images=[image],
        ctr=kube.real.assets / "ctr",
        address=kube.real.layout.containerd_socket,
        snapshotter="overlayfs",
    )


@pytest.fixture(scope="session")
def nymph_image() -> LocalImage:
    """``nymph.local/nymph:dev`` from this checkout's sources, built since collection ended."""
    return build_of("nymph").result()


@pytest.fixture(scope="session")
def nymph_image_on_node(real_kube: LocalCluster, nymph_image: LocalImage) -> str:
    """The nymph image imported once into ``real_kube``'s node; its name."""
    import_into_node(real_kube, nymph_image)
    return nymph_image.name
