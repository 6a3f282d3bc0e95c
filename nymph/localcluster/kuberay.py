"""The KubeRay operator beside the local control plane, started on demand by the tests that need
RayJobs and RayClusters reconciled.

It runs on the host, outside the cluster, as one of the cluster's processes (so it stops with
it): ``--kubeconfig`` the admin kubeconfig, ``--enable-leader-election=false`` (leader election
needs an in-cluster namespace), and ``--use-kubernetes-proxy`` (the host cannot resolve
``*.svc.cluster.local``: the operator reaches each head's dashboard through the API server's
service proxy). Its CRDs (the operator module's own, RayService included: the operator waits for
every CRD it watches and exits without one) are applied server-side first. Its metrics and probe
ports are free loopback ports, so concurrent clusters never collide.
"""

from __future__ import annotations

import contextlib
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from nymph.errors import NymphError
from nymph.localcluster.procs import Proc, ProcessesSurvived, free_port, spawn, stop_all

CRD_FILES = ("ray.io_rayclusters.yaml", "ray.io_rayjobs.yaml", "ray.io_rayservices.yaml")
FIELD_MANAGER = "nymph-localcluster"


class KubeRayError(NymphError):
    """The KubeRay operator could not be started."""


@dataclass(frozen=True)
class KubeRayOperator:
    """A running operator: its process and the address of its health probe."""

    proc: Proc
    probe: str

    def alive(self) -> bool:
        return self.proc.popen.poll() is None


def operator_argv(*, binary: Path, kubeconfig: Path, metrics_port: int, probe_port: int) -> list[str]:
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        "--enable-leader-election=false",
        "--use-kubernetes-proxy",
        f"--metrics-addr=127.0.0.1:{metrics_port}",
        f"--health-probe-bind-address=127.0.0.1:{probe_port}",
        "--log-stdout-encoder=console",
    ]


def crd_files(crds: Path) -> list[Path]:
    missing = [f for f in CRD_FILES if not (crds / f).is_file()]
    if missing:
        raise KubeRayError(f"KubeRay CRDs missing in {crds}: {', '.join(missing)}")
    return [crds / f for f in CRD_FILES]


def established(crd: object) -> bool:
    """Whether a CustomResourceDefinition object reports ``Established``."""
    status = crd.get("status") if isinstance(crd, dict) else None
    conds = status.get("conditions") if isinstance(status, dict) else None
    return any(
        isinstance(c, dict) and c.get("type") == "Established" and c.get("status") == "True"
        for c in conds or []
    )


def wait_probe(op: KubeRayOperator, *, deadline: float) -> None:
    """Wait until the operator's ``/readyz`` answers 200 (or it exits)."""
    last = ""
    while time.monotonic() < deadline:
        if not op.alive():
            raise KubeRayError(
                f"the KubeRay operator exited with code {op.proc.popen.returncode}; last log lines:\n"
                f"{op.proc.tail()}"
            )
        try:
            with urllib.request.urlopen(f"{op.probe}/readyz", timeout=2) as resp:  # noqa: S310
                if resp.status == 200:
                    return
        except (OSError, urllib.error.URLError) as exc:
            last = str(exc)
        time.sleep(0.2)
    raise KubeRayError(f"the KubeRay operator was not ready in time ({last}); log:\n{op.proc.tail()}")


def start_operator(
    *,
    binary: Path,
    crds: Path,
    kubeconfig: Path,
    logdir: Path,
    apply: Callable[[Path], object],
    get_crd: Callable[[str], object],
    timeout: float = 120.0,
) -> KubeRayOperator:
    """Apply the CRDs (``apply(file)``, server-side), wait for them to be established
    (``get_crd(name)`` returns the CRD object), then start the operator and wait for its probe."""
    deadline = time.monotonic() + timeout
    files = crd_files(crds)
    for f in files:
        apply(f)
    for f in files:
        name = f.name.removeprefix("ray.io_").removesuffix(".yaml") + ".ray.io"
        while not established(get_crd(name)):
            if time.monotonic() > deadline:
                raise KubeRayError(f"CRD {name} not established in time")
            time.sleep(0.2)
    probe_port = free_port()
    argv = operator_argv(
        binary=binary, kubeconfig=kubeconfig, metrics_port=free_port(), probe_port=probe_port
    )
    op = KubeRayOperator(
        proc=spawn("kuberay-operator", argv, logdir=logdir), probe=f"http://127.0.0.1:{probe_port}"
    )
    try:
        wait_probe(op, deadline=deadline)
    except BaseException:
        with contextlib.suppress(ProcessesSurvived):  # the error that stopped it is the one to tell
            stop_all([op.proc], grace=2.0)
        raise
    return op


class _Cluster(Protocol):
    kubeconfig: Path
    workdir: Path

    def kubectl(self, *args: str) -> object: ...

    def api(self, method: str, path: str) -> object: ...


def start_for(cluster: _Cluster, *, binary: Path, crds: Path, timeout: float = 120.0) -> KubeRayOperator:
    """:func:`start_operator` for a local cluster (its admin kubeconfig, kubectl and API)."""
    return start_operator(
        binary=binary,
        crds=crds,
        kubeconfig=cluster.kubeconfig,
        logdir=cluster.workdir,
        apply=lambda f: cluster.kubectl(
            "apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "-f", str(f)
        ),
        get_crd=lambda name: cluster.api(
            "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
        ),
        timeout=timeout,
    )
