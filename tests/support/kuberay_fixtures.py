"""The KubeRay operator on the real node, for the tests whose RayJobs and RayClusters must really
be reconciled.

* ``kuberay_tools`` (session): the directory ``tests/envtest/build-tools.sh kuberay-operator``
  built or reuses (the operator binary and its CRDs). Without Go and no build the tests skip,
  or fail under ``NYMPH_E2E=require``.
* ``kuberay_operator`` (session): the operator started beside ``real_kube`` (its CRDs applied
  server-side first), stopped at the end of the session or with the cluster. A session that
  collects a test using it starts ``real_kube`` with the Ray image among the node's images
  (``real_kube_images``), so the node's seed holds it and a warm run imports nothing; its
  build starts in the background once collection is done. That ``real_kube`` also runs the
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
    """The real node's images: pause and python, and the Ray image when the session needs it."""
    images = default_images()
    if session_needs_ray(session):
        from nymph.localcluster.rayimage import ensure_ray_image

        ray = _RAY_BUILD[0].result() if _RAY_BUILD else ensure_ray_image()
        images.append(NodeImage(name=ray.name, archive=ray.oci_archive))
    return images


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
    op = real_kube.start_kuberay(binary=kuberay_tools / "kuberay-operator", crds=kuberay_tools / "crds")
    try:
        yield op
    finally:
        if op.proc in real_kube.procs:
            real_kube.procs.remove(op.proc)
        stop_all([op.proc], grace=5.0)
