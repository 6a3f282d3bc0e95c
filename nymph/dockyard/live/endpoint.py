"""How the client reaches a Ray head's dashboard (the Jobs REST API).

In order: an explicit ``--ray-address``; inside the cluster, the head Service's DNS name;
otherwise ``kubectl port-forward`` to the head Service's dashboard port for the duration of
the call (a free local port, released on exit). ``submit.portForward`` (:func:`route`)
chooses for ``run``: ``auto`` as above; ``kubectl-port-forward`` and ``kubectl-ray-plugin``
forward even inside the cluster (the plugin's ``session`` is itself a port-forward of the head
Service; nymph runs kubectl's own, so the plugin need not be installed).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

from nymph.dockyard.errors import DockyardLiveError
from nymph.dockyard.live import status
from nymph.dockyard.live.kubectl import Kube, Say, in_cluster
from nymph.dockyard.live.rayapi import normalize_address
from nymph.dockyard.render import plan
from nymph.dockyard.spec.enums import PortForwardMode

#: how :func:`dashboard` reaches the head: ``--ray-address``, the head Service's cluster DNS
#: name, or a kubectl port-forward
Route = Literal["address", "service", "forward"]


def route(*, mode: PortForwardMode, ray_address: str | None, inside: bool) -> Route:
    """How the dashboard is reached: an explicit address always wins; then ``auto`` uses the
    Service address inside the cluster and a forward outside; the explicit forward modes
    always forward."""
    if ray_address:
        return "address"
    if mode is PortForwardMode.AUTO and inside:
        return "service"
    return "forward"


_FORWARDING = re.compile(rb"Forwarding from 127\.0\.0\.1:(\d+) ->")


@contextlib.asynccontextmanager
async def port_forward(
    kube: Kube, *, namespace: str, service: str, port: int, timeout: float = 30.0, local_port: int = 0
) -> AsyncIterator[str]:
    """``kubectl port-forward service/NAME LOCAL:PORT`` on 127.0.0.1 (a free local port when
    ``local_port`` is 0); yields ``http://127.0.0.1:N``."""
    local_spec = f"{local_port}:{port}" if local_port else f":{port}"
    proc = await asyncio.create_subprocess_exec(
        *kube.argv(
            ["port-forward", "-n", namespace, f"service/{service}", local_spec, "--address", "127.0.0.1"]
        ),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    stdout, stderr = proc.stdout, proc.stderr
    drain: asyncio.Task[None] | None = None
    try:

        async def first_port() -> int | None:
            async for line in stdout:
                found = _FORWARDING.search(line)
                if found:
                    return int(found.group(1))
            return None

        try:
            local = await asyncio.wait_for(first_port(), timeout)
        except TimeoutError:
            local = None
        if local is None:
            if proc.returncode is None:
                proc.kill()
            detail = (await stderr.read()).decode(errors="replace").strip().splitlines()
            reason = detail[-1] if detail else f"no forwarding within {timeout:.0f}s"
            raise DockyardLiveError(
                f"kubectl port-forward to service/{service} in {namespace} failed: {reason} "
                "(is the head Pod running? or pass --ray-address URL)"
            )

        async def discard() -> None:  # "Handling connection for N" lines and per-connection
            # errors must not fill the pipes while the forward is in use
            await asyncio.gather(_sink(stdout), _sink(stderr))

        drain = asyncio.ensure_future(discard())
        yield f"http://127.0.0.1:{local}"
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 5)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if drain is not None:
            drain.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await drain


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


async def _sink(stream: asyncio.StreamReader) -> None:
    while await stream.read(65536):
        pass


@dataclass
class HeadTarget:
    """The RayCluster whose head is reached, and how long to wait for it."""

    namespace: str
    cluster: str
    deadline: float  # time.monotonic() value
    interval: float = 2.0


async def wait_head_service(kube: Kube, target: HeadTarget, *, say: Say) -> dict[str, Any]:
    """The head Service, once KubeRay has created it (``status.head.serviceName`` when set)."""
    last = ""
    while True:
        rc = await kube.get("rayclusters.ray.io", target.cluster, namespace=target.namespace)
        if rc is None:
            raise DockyardLiveError(
                f"RayCluster {target.cluster} not found in namespace {target.namespace} "
                "(list them with: nymph dockyard cluster list)"
            )
        head = (rc.get("status") or {}).get("head") or {}
        name = str(head.get("serviceName") or plan.head_service_name(target.cluster))
        svc = await kube.get("services", name, namespace=target.namespace)
        if svc is not None:
            return svc
        line = status.raycluster_line(rc)
        if line != last:
            say(f"waiting for the head service {name}: RayCluster {target.cluster} {line}")
            last = line
        if time.monotonic() >= target.deadline:
            raise DockyardLiveError(
                f"no head service {name} for RayCluster {target.cluster} in time (is the KubeRay "
                "operator running? check: nymph dockyard status / nymph dockyard doctor)"
            )
        await asyncio.sleep(target.interval)


async def wait_head_pod(kube: Kube, target: HeadTarget, *, say: Say) -> None:
    """Until a head Pod is Running and Ready (port-forward needs one)."""
    selector = plan.ray_pod_selector(target.cluster, source=plan.LogSource.HEAD)
    announced = False
    while True:
        pods = await kube.list_objects("pods", namespace=target.namespace, selector=selector)
        if any(_ready(p) for p in pods):
            return
        if not announced:
            say(f"waiting for the head pod of {target.cluster} to be ready ({selector})")
            announced = True
        if time.monotonic() >= target.deadline:
            raise DockyardLiveError(
                f"the head pod of RayCluster {target.cluster} is not ready in time "
                f"(see: nymph dockyard logs --source head, kubectl describe pod -l {selector})"
            )
        await asyncio.sleep(target.interval)


def _ready(pod: dict[str, Any]) -> bool:
    st = pod.get("status")
    if not isinstance(st, dict) or st.get("phase") != "Running":
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])


@contextlib.asynccontextmanager
async def dashboard(
    kube: Kube,
    target: HeadTarget | None,
    *,
    ray_address: str | None,
    kubeconfig: str | None,
    say: Say,
    local_port: int = 0,
    forward: PortForwardMode = PortForwardMode.AUTO,
) -> AsyncIterator[str]:
    """The dashboard URL of the head of ``target`` (or ``ray_address``), usable inside the
    ``async with`` block. With a ``target`` its head Service must exist first, whatever the
    address; ``ray_address`` only changes how the dashboard is reached, ``forward``
    (``submit.portForward``) whether it is forwarded (:func:`route`). A port-forward listens
    on ``local_port`` (``submit.localDashboardPort``) when it is free, else on any free port."""
    if target is None and not ray_address:
        raise DockyardLiveError("no Ray head to talk to: pass --cluster NAME or --ray-address URL")
    svc = await wait_head_service(kube, target, say=say) if target is not None else None
    how = route(mode=forward, ray_address=ray_address, inside=in_cluster(kubeconfig))
    if how == "address":
        assert ray_address
        yield normalize_address(ray_address)
        return
    assert target is not None and svc is not None
    port = plan.dashboard_port(svc)
    name = str((svc.get("metadata") or {}).get("name"))
    if how == "service":
        yield plan.in_cluster_url(name, namespace=target.namespace, port=port)
        return
    await wait_head_pod(kube, target, say=say)
    if local_port and not port_free(local_port):
        say(f"local port {local_port} is taken: forwarding from a free one")
        local_port = 0
    async with port_forward(
        kube, namespace=target.namespace, service=name, port=port, local_port=local_port
    ) as url:
        say(f"reaching the Ray dashboard through kubectl port-forward service/{name} ({url})")
        yield url
