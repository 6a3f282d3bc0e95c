"""The sandbox pool's NetworkPolicy, as ``nymph dockyard render`` renders it, enforced on the real
node by a policy engine: kube-router's firewall (:mod:`nymph.localcluster.kuberouter`, a
test-only engine on this throwaway node), started for this module and gone with every iptables
rule, chain and ipset it made, which the module checks against ``iptables-save`` and ``ipset list
-n`` taken before it started.

One namespace holds the sandbox pool (its executor serves the executor port and, so that a
refusal by the policy differs from a closed port, a second port) with ``allowEgress: false``
and one allowed CIDR (the address of a Pod in a second namespace), and a client Pod; the second
namespace holds that other Pod, which serves a port and has no policy. The host serves a port
and DNS's port 53 on its own address outside the node's networks. Every probe runs inside a Pod
(python3 in the local python image), each target at once, until the engine has caught up.
"""

from __future__ import annotations

import contextlib
import io
import json
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from nymph.cli import main
from nymph.localcluster import LocalCluster
from nymph.localcluster.images import PYTHON_IMAGE
from nymph.localcluster.kuberouter import KubeRouter, start_for
from nymph.localcluster.nodeconfig import SUBNET_PREFIX
from tests.support.kube_fixtures import _skip_or_fail, new_namespace
from tests.support.kuberay_fixtures import BUILD_TOOLS

pytestmark = [pytest.mark.e2e, pytest.mark.realnode, pytest.mark.timeout(600)]

EXECUTOR, OTHER, OUTSIDER_PORT = 9090, 9091, 8080
OPEN, BLOCKED = "open", "blocked"

# Runs in a Pod (or on the host): connect to every target at once; "open" when TCP connects or a
# UDP datagram is answered, else "blocked" (refused, unreachable, timed out), with the reason.
PROBE = """
import json, socket, sys, threading
out = {}
def go(key, proto, host, port):
    try:
        if proto == "tcp":
            socket.create_connection((host, port), timeout=2).close()
        else:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.settimeout(2)
            s.connect((host, port))
            s.send(b"ping")
            s.recv(16)
        out[key] = ["open", ""]
    except OSError as exc:
        out[key] = ["blocked", type(exc).__name__]
ts = [threading.Thread(target=go, args=t) for t in json.loads(sys.argv[1])]
[t.start() for t in ts]
[t.join() for t in ts]
print(json.dumps(out))
"""

Target = tuple[str, str, str, int]  # (key, proto, host, port)


@dataclass
class Net:
    kube: LocalCluster
    namespace: str
    other: str
    sandbox: str  # the sandbox Pod's name
    sandbox_ip: str
    outsider_ip: str
    outside_ip: str  # the host's address outside the node's networks
    outside_port: int
    dns: bool  # whether the host serves TCP and UDP 53 on outside_ip


def _outside_address() -> str | None:
    """The host's source address towards the outside world (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("203.0.113.1", 9))
        except OSError:
            return None
        addr = str(s.getsockname()[0])
    return None if addr.startswith((f"{SUBNET_PREFIX}.", "127.")) else addr


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        if isinstance(self.request, tuple):  # UDP: (data, socket)
            self.request[1].sendto(self.request[0], self.client_address)


class _TCPServer(socketserver.ThreadingTCPServer):
    allow_reuse_address = True  # it closes first: its port is in TIME_WAIT for the next run
    daemon_threads = True


@contextlib.contextmanager
def _serving(host: str, port: int, *, udp: bool = False) -> Iterator[int]:
    """A TCP (or UDP echo) server on ``host:port`` in a named thread, for the block."""
    server = socketserver.ThreadingUDPServer((host, port), _Echo) if udp else _TCPServer((host, port), _Echo)
    name = f"netpol-{'udp' if udp else 'tcp'}-{port}"
    thread = threading.Thread(target=server.serve_forever, name=name, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture(scope="module")
def kube_router_binary() -> Path:
    res = subprocess.run(
        ["bash", str(BUILD_TOOLS), "kube-router"], capture_output=True, text=True, timeout=3600, check=False
    )
    if res.returncode != 0:
        _skip_or_fail(f"kube-router could not be built: {res.stderr.strip()[-500:]}")
    binary = Path(res.stdout.strip().splitlines()[-1]) / "kube-router"
    assert binary.is_file(), binary
    return binary


@pytest.fixture(scope="module")
def engine(real_kube: LocalCluster, kube_router_binary: Path) -> Iterator[KubeRouter]:
    """kube-router for the module; at the end the host's rules and ipsets are as before it."""
    router = start_for(real_kube, binary=kube_router_binary)
    try:
        yield router
    finally:
        leftovers = router.stop()
        assert leftovers == [], "kube-router left on the host:\n" + "\n".join(leftovers)


def _pod(name: str, namespace: str, node: str, command: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": PYTHON_IMAGE, "command": command}],
        },
    }


def _running(kube: LocalCluster, namespace: str, selector: str, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        pods = kube.api("GET", f"/api/v1/namespaces/{namespace}/pods?labelSelector={selector}")["items"]
        ready = [
            p
            for p in pods
            if p["status"].get("podIP")
            and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
        ]
        if ready:
            return ready[0]
        assert time.monotonic() < deadline, f"no ready Pod {selector} in {namespace}: {pods}"
        time.sleep(0.2)


def _sandbox_manifests(work: Path, namespace: str, node: str, allowed: str) -> str:
    """``nymph dockyard render`` of an infra whose sandbox pool is locked down; the pool's
    objects only (the RayJob stays out: no operator runs here)."""
    infra = {
        "image": PYTHON_IMAGE,
        "namespace": namespace,
        "launch": {"mode": "rayjob", "entrypoint": "true"},
        "sandbox": {
            "name": "sbx",
            "replicas": 1,
            "networkPolicy": {"allowEgress": False, "allowedEgressCidrs": [allowed]},
            "spec": {
                "template": {
                    "spec": {
                        "nodeSelector": {"kubernetes.io/hostname": node},
                        "terminationGracePeriodSeconds": 0,
                        "containers": [
                            {
                                "name": "task-executor",
                                "command": [
                                    "sh", "-c",
                                    f"python3 -m http.server {OTHER} & exec python3 -m http.server {EXECUTOR}",
                                ],
                            }
                        ],
                    }
                }
            },
        },
        "kuberay": {
            "name": "grpo",
            "spec": {
                "headGroupSpec": {"template": {"spec": {"containers": [{"name": "ray-head"}]}}},
                "workerGroupSpecs": [
                    {"groupName": g, "replicas": 0, "template": {"spec": {"containers": [{"name": "w"}]}}}
                    for g in ("trainer", "inference")
                ],
            },
        },
    }  # fmt: skip
    (work / "recipe.yaml").write_text("grpo: {max_num_steps: 1}\n")
    (work / "infra.yaml").write_text(yaml.safe_dump(infra))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["dockyard", "render", str(work / "recipe.yaml"), "--infra", str(work / "infra.yaml")])
    assert code == 0, err.getvalue()
    docs = [d for d in yaml.safe_load_all(out.getvalue()) if d and not d["apiVersion"].startswith("ray.io/")]
    assert "NetworkPolicy" in {d["kind"] for d in docs}, docs
    return yaml.safe_dump_all(docs)


@pytest.fixture(scope="module")
def net(
    real_kube: LocalCluster, engine: KubeRouter, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Net]:
    kube, node = real_kube, real_kube.real_node
    assert node is not None
    outside = _outside_address()
    if outside is None:
        _skip_or_fail("the host has no address outside the node's networks to be an egress target")
    assert outside is not None
    ns, other = new_namespace(kube), new_namespace(kube)
    try:
        with contextlib.ExitStack() as stack:
            port = stack.enter_context(_serving(outside, 0))
            dns = True
            try:
                stack.enter_context(_serving(outside, 53))
                stack.enter_context(_serving(outside, 53, udp=True))
            except OSError:
                dns = False  # something else serves port 53 there
            kube.api("POST", f"/api/v1/namespaces/{ns}/pods", _pod("client", ns, node, ["sleep", "infinity"]))
            serve = ["python3", "-m", "http.server", str(OUTSIDER_PORT)]
            kube.api("POST", f"/api/v1/namespaces/{other}/pods", _pod("outsider", other, node, serve))
            outsider = _running(kube, other, "app%3Doutsider")["status"]["podIP"]
            _running(kube, ns, "app%3Dclient")
            stream = _sandbox_manifests(tmp_path_factory.mktemp("netpol"), ns, node, f"{outsider}/32")
            kube.kubectl("apply", "--server-side", "--field-manager=nymph", "-n", ns, "-f", "-", input=stream)
            sandbox = _running(kube, ns, "app.kubernetes.io%2Fname%3Dsbx")
            yield Net(
                kube, ns, other, sandbox["metadata"]["name"], sandbox["status"]["podIP"],
                outsider, outside, port, dns,
            )  # fmt: skip
    finally:
        for n in (ns, other):
            kube.kubectl("delete", "namespace", n, "--wait=false", check=False)


Where = tuple[str, str] | None  # a Pod (namespace, name), or None: the host


def _probe(net: Net, where: Where, targets: list[Target]) -> dict[str, list[str]]:
    """PROBE in a Pod (``kubectl exec``) or on the host: key -> [outcome, reason]."""
    arg = json.dumps(targets)
    if where is None:
        res = subprocess.run(
            [sys.executable, "-c", PROBE, arg], capture_output=True, text=True, timeout=30, check=True
        )
        out = res.stdout
    else:
        out = net.kube.kubectl("exec", "-n", where[0], where[1], "--", "python3", "-c", PROBE, arg).stdout
    got: dict[str, list[str]] = json.loads(out)
    return got


def _expect(net: Net, probes: dict[Where, list[tuple[Target, str]]], timeout: float = 30) -> None:
    """Probe until every target's outcome is the expected one (the engine applies a policy a
    moment after it changes); fail with every outcome when that does not happen in time."""
    deadline = time.monotonic() + timeout
    while True:
        results: dict[str, list[str]] = {}
        for where, wanted in probes.items():
            got = _probe(net, where, [t for t, _ in wanted])
            for target, want in wanted:
                results[f"{where[1] if where else 'host'} -> {target[0]}"] = [want, *got[target[0]]]
        if all(r[0] == r[1] for r in results.values()):
            return
        assert time.monotonic() < deadline, "want, got, why:\n" + json.dumps(results, indent=1)
        time.sleep(0.3)


def test_in_namespace_pods_reach_the_executor_port_only(net: Net) -> None:
    """A Pod of the sandbox's namespace connects to the executor port and is refused on the
    other port the executor serves; the node itself reaches both (so the refusal is the
    policy's, not a closed port)."""
    ports = [("executor", "tcp", net.sandbox_ip, EXECUTOR), ("other-port", "tcp", net.sandbox_ip, OTHER)]
    _expect(
        net,
        {
            None: [(ports[0], OPEN), (ports[1], OPEN)],
            (net.namespace, "client"): [(ports[0], OPEN), (ports[1], BLOCKED)],
        },
    )


def test_pods_of_another_namespace_are_refused(net: Net) -> None:
    """A Pod in another namespace reaches neither port of the sandbox."""
    _expect(
        net,
        {
            (net.other, "outsider"): [
                (("executor", "tcp", net.sandbox_ip, EXECUTOR), BLOCKED),
                (("other-port", "tcp", net.sandbox_ip, OTHER), BLOCKED),
            ]
        },
    )


def test_without_allow_egress_only_the_listed_cidr_goes_out(net: Net) -> None:
    """With ``allowEgress: false`` the sandbox reaches the one allowed CIDR (a Pod of another
    namespace) and is refused a port of an address outside the node's networks, which a Pod
    without a policy reaches."""
    outside = ("outside", "tcp", net.outside_ip, net.outside_port)
    _expect(
        net,
        {
            (net.namespace, net.sandbox): [
                (("listed-cidr", "tcp", net.outsider_ip, OUTSIDER_PORT), OPEN),
                (outside, BLOCKED),
            ],
            (net.other, "outsider"): [(outside, OPEN)],
        },
    )


def test_without_allow_egress_dns_still_goes_out(net: Net) -> None:
    """Port 53, TCP and UDP, stays open from the sandbox to an address outside the node's
    networks and the allowed CIDR, where any other port is refused."""
    if not net.dns:
        _skip_or_fail(
            f"port 53 on {net.outside_ip} is taken on this host (stop what serves it): DNS egress not probed"
        )
    _expect(
        net,
        {
            (net.namespace, net.sandbox): [
                (("dns-tcp", "tcp", net.outside_ip, 53), OPEN),
                (("dns-udp", "udp", net.outside_ip, 53), OPEN),
                (("outside", "tcp", net.outside_ip, net.outside_port), BLOCKED),
            ]
        },
    )
