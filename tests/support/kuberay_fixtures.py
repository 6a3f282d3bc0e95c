"""The KubeRay operator on the real node, for the tests whose RayJobs and RayClusters must really
be reconciled.

* ``kuberay_tools`` (session): the directory ``tests/envtest/build-tools.sh kuberay-operator``
  built or reuses (the operator binary and its CRDs). Without Go and no build the tests skip,
  or fail under ``NYMPH_E2E=require``.
* ``kuberay_operator`` (session): the operator started beside ``real_kube`` (its CRDs applied
  server-side first), stopped at the end of the session or with the cluster. A session that
  collects a test using it builds the Ray image in the background from the end of collection
  on, and starts ``real_kube`` with it among the node's images when it is built by then
  (``real_kube_images``: always on a warm cache, so the node's seed holds it and nothing is
  imported), else imports it when the operator starts. That ``real_kube`` also runs the
  local cluster DNS (:mod:`nymph.localcluster.clusterdns`), so Ray workers find their head.
"""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from nymph.localcluster import LocalCluster
from nymph.localcluster.images import LocalImage
from nymph.localcluster.kuberay import KubeRayOperator
from nymph.localcluster.procs import stop_all
from nymph.localcluster.realnode import NodeImage, default_images

REPO = Path(__file__).resolve().parents[2]
BUILD_TOOLS = REPO / "tests" / "envtest" / "build-tools.sh"
OPERATOR_FIXTURE = "kuberay_operator"
WARM_WAIT_SECONDS = 15.0


def session_needs_ray(session: pytest.Session) -> bool:
    """Whether a collected test asks for the operator (directly or through another fixture)."""
    return any(OPERATOR_FIXTURE in getattr(item, "fixturenames", ()) for item in session.items)


_RAY_BUILD: list[concurrent.futures.Future[LocalImage]] = []


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start building the Ray image (minutes cold) as soon as the session is known to need it,
    beside the tests that run before the first real-node one."""
    if session_needs_ray(session) and not _RAY_BUILD and os.geteuid() == 0:
        from nymph.localcluster.rayimage import ensure_ray_image

        pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ray-image")
        _RAY_BUILD.append(pool.submit(ensure_ray_image))
        pool.shutdown(wait=False)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """A run that ends before it needed the image still lets its build finish (no debootstrap
    is left running)."""
    for build in _RAY_BUILD:
        concurrent.futures.wait([build])


def real_kube_images(session: pytest.Session) -> list[NodeImage]:
    """The real node's images: pause and python, and the Ray image when the session needs it
    and its build is done (a warm cache: at once). A cold build still running is not waited
    for here, under whichever test starts the node first: ``kuberay_operator`` imports the
    image into the node once it is built."""
    images = default_images()
    if session_needs_ray(session) and _RAY_BUILD:
        concurrent.futures.wait(_RAY_BUILD, timeout=WARM_WAIT_SECONDS)  # a cache hit takes ms
    if session_needs_ray(session) and _RAY_BUILD and _RAY_BUILD[0].done() and not _RAY_BUILD[0].exception():
        ray = _RAY_BUILD[0].result()
        images.append(NodeImage(name=ray.name, archive=ray.oci_archive))
    return images


def _ray_image_on(kube: LocalCluster) -> None:
    """Import the Ray image into the running node unless it started with it."""
    from nymph.localcluster.images import import_images
    from nymph.localcluster.rayimage import ensure_ray_image

    ray = _RAY_BUILD[0].result() if _RAY_BUILD else ensure_ray_image()
    if ray.name in kube.node_image_names:
        return
    assert kube.real is not None and kube.real.layout is not None
    import_images(
        images=[ray],
        ctr=kube.real.assets / "ctr",
        address=kube.real.layout.containerd_socket,
        snapshotter="overlayfs",
    )


def _skip_or_fail(message: str) -> None:
    from tests.support.kube_fixtures import _skip_or_fail as policy

    policy(message)


@pytest.fixture(scope="session")
def kuberay_tools() -> Path:
    res = subprocess.run(
        ["bash", str(BUILD_TOOLS), "kuberay-operator"],
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    if res.returncode != 0:
        _skip_or_fail(f"the KubeRay operator could not be built: {res.stderr.strip()[-500:]}")
    tools = Path(res.stdout.strip().splitlines()[-1])
    assert (tools / "kuberay-operator").is_file() and (tools / "crds").is_dir(), tools
    return tools


@pytest.fixture(scope="session")
def kuberay_operator(real_kube: LocalCluster, kuberay_tools: Path) -> Iterator[KubeRayOperator]:
    _ray_image_on(real_kube)
    op = real_kube.start_kuberay(binary=kuberay_tools / "kuberay-operator", crds=kuberay_tools / "crds")
    try:
        yield op
    finally:
        if op.proc in real_kube.procs:
            real_kube.procs.remove(op.proc)
        stop_all([op.proc], grace=5.0)
