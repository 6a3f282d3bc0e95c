"""The KubeRay operator on the real node, for the tests whose RayJobs and RayClusters must really
be reconciled.

* ``kuberay_tools`` (session): the directory ``tests/envtest/build-tools.sh kuberay-operator``
  built or reuses (the operator binary and its CRDs). Without Go and no build the tests skip,
  or fail under ``NYMPH_E2E=require``.
* ``kuberay_operator`` (session): the operator started beside ``real_kube`` (its CRDs applied
  server-side first), stopped at the end of the session or with the cluster. A session that
  collects a test using it builds the Ray image in the background from the end of collection
  on (tests/support/image_builds.py), and starts ``real_kube`` with it among the node's images
  when it is built by then (``real_kube_images``: always on a warm cache, so the node's seed
  holds it and nothing is imported), else imports it when the operator starts. That
  ``real_kube`` also runs the local cluster DNS (:mod:`nymph.localcluster.clusterdns`), so Ray
  workers find their head.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from nymph.localcluster import LocalCluster
from nymph.localcluster.kuberay import KubeRayOperator
from nymph.localcluster.procs import stop_all
from nymph.localcluster.realnode import NodeImage, default_images
from tests.support.image_builds import build_of, import_into_node, session_needs, started

REPO = Path(__file__).resolve().parents[2]
BUILD_TOOLS = REPO / "tests" / "envtest" / "build-tools.sh"
WARM_WAIT_SECONDS = 15.0


def session_needs_ray(session: pytest.Session) -> bool:
    """Whether a collected test asks for the operator (directly or through another fixture)."""
    return session_needs(session, "ray")


def real_kube_images(session: pytest.Session) -> list[NodeImage]:
    """The real node's images: pause and python, and the Ray image when the session needs it
    and its build is done (a warm cache: at once). A cold build still running is not waited
    for here, under whichever test starts the node first: ``kuberay_operator`` imports the
    image into the node once it is built."""
    images = default_images()
    build = started("ray") if session_needs_ray(session) else None
    if build is not None and build.wait(WARM_WAIT_SECONDS) and build.proc.popen.returncode == 0:
        ray = build.result()
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
    import_into_node(real_kube, build_of("ray").result())
    op = real_kube.start_kuberay(binary=kuberay_tools / "kuberay-operator", crds=kuberay_tools / "crds")
    try:
        yield op
    finally:
        if op.proc in real_kube.procs:
            real_kube.procs.remove(op.proc)
        stop_all([op.proc], grace=5.0)
