"""kube-router's NetworkPolicy firewall beside the local control plane, started on demand by the
tests that prove a NetworkPolicy is enforced on the real node.

kube-router is a **test-only policy engine on a throwaway node** here: nymph neither ships nor
depends on it (its advisories concern its BGP router and service proxy, which stay off), and it
runs only for those tests, on the local real node, while they run.

It runs on the host (as root, like the node), with its firewall alone: ``--run-firewall
--run-router=false --run-service-proxy=false --enable-cni=false``, the node's name and the
Service range, its health and metrics ports off (so it opens no port). It writes the host's
iptables ``filter`` table (jumps at the top of INPUT, FORWARD and OUTPUT into its
``KUBE-ROUTER-*`` chains, then a chain per policy and per Pod) and ipsets, and leaves all of it
on SIGTERM. :meth:`KubeRouter.stop` removes exactly that: the rules, chains and ipsets named as
kube-router names them and added since it started (:mod:`nymph.localcluster.netfilter`), and
returns what still differs from the host as it was before the start (nothing, normally). It
refuses to start beside chains or sets of that kind left by a run that was killed.
"""

from __future__ import annotations

import atexit
import contextlib
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from nymph.errors import NymphError
from nymph.localcluster import netfilter
from nymph.localcluster.procs import Proc, ProcessesSurvived, spawn, stop_all

if TYPE_CHECKING:
    from nymph.localcluster.cluster import LocalCluster

#: kube-router's own chain and ipset names (its netpol controller's prefixes)
CHAIN_PREFIXES = ("KUBE-ROUTER-", "KUBE-NWPLCY-", "KUBE-POD-FW-")
IPSET_PREFIXES = ("KUBE-SRC-", "KUBE-DST-")
#: the temporary set of its atomic ipset swaps (``TMP-`` and 16 base32 characters)
TMP_IPSET = re.compile(r"TMP-[A-Z2-7]{16}")
TOP_CHAINS = {"INPUT": "KUBE-ROUTER-INPUT", "FORWARD": "KUBE-ROUTER-FORWARD", "OUTPUT": "KUBE-ROUTER-OUTPUT"}
BRIDGE_NF = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")


class KubeRouterError(NymphError):
    """kube-router could not be started or its rules removed."""


def owned(name: str) -> bool:
    """Whether a chain or ipset name is one kube-router makes (IPv6 sets carry ``inet6:``)."""
    name = name.removeprefix("inet6:")
    return name.startswith((*CHAIN_PREFIXES, *IPSET_PREFIXES)) or TMP_IPSET.fullmatch(name) is not None


def router_argv(*, binary: Path, kubeconfig: Path, node: str, service_range: str) -> list[str]:
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        "--run-firewall",
        "--run-router=false",
        "--run-service-proxy=false",
        "--enable-cni=false",
        f"--hostname-override={node}",
        f"--service-cluster-ip-range={service_range}",
        "--health-port=0",
        "--metrics-port=0",
    ]


def leftover_names(snap: netfilter.Snapshot) -> list[str]:
    """kube-router chains and ipsets already on the host."""
    chains = {
        chain
        for text in snap.rules.values()
        for chains in netfilter.parse(text).values()
        for chain in chains
        if owned(chain)
    }
    return sorted(chains) + [s for s in snap.ipsets if owned(s)]


def firewall_ready(snap: netfilter.Snapshot) -> bool:
    """Whether the top-level jumps into kube-router's chains are in place."""
    filt = netfilter.parse(snap.rules.get("ipv4", "")).get("filter", {})
    return all(
        any(r.endswith(f"-j {target}") for r in filt.get(builtin, ("", []))[1])
        for builtin, target in TOP_CHAINS.items()
    )


@dataclass
class KubeRouter:
    """A running kube-router and the host's packet filter as it was before it started."""

    proc: Proc
    before: netfilter.Snapshot
    leftovers: list[str] = field(default_factory=list)
    stopped: bool = False

    def alive(self) -> bool:
        return self.proc.popen.poll() is None

    def stop(self, *, grace: float = 5.0) -> list[str]:
        """Stop it, remove what it added, and return what still differs from before (idempotent)."""
        if self.stopped:
            return self.leftovers
        self.stopped = True
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
        survived: list[str] = []
        try:
            stop_all([self.proc], grace=grace)
        except ProcessesSurvived as exc:  # its rules are still undone
            survived.append(str(exc))
        netfilter.undo(self.before, netfilter.snapshot(), owned=owned)
        self.leftovers = survived + netfilter.differences(self.before, netfilter.snapshot())
        return self.leftovers


def preflight(binary: Path) -> None:
    if not binary.is_file():
        raise KubeRouterError(f"kube-router not found at {binary} (tests/envtest/build-tools.sh kube-router)")
    missing = netfilter.missing_tools()
    if missing:
        raise KubeRouterError(f"kube-router needs {', '.join(missing)} on PATH (tests/envtest/deps.sh)")
    try:
        bridged = BRIDGE_NF.read_text().strip() == "1"
    except OSError:
        bridged = False
    if not bridged:
        raise KubeRouterError(
            f"{BRIDGE_NF} is not 1 (br_netfilter): Pod-to-Pod traffic on the node's bridge would "
            "bypass iptables and no policy would hold"
        )


def start_kube_router(
    *, binary: Path, kubeconfig: Path, node: str, service_range: str, logdir: Path, timeout: float = 60.0
) -> KubeRouter:
    """Snapshot the host's rules, start kube-router and wait for its top-level jumps."""
    preflight(binary)
    before = netfilter.snapshot()
    stale = leftover_names(before)
    if stale:
        raise KubeRouterError(
            "kube-router chains or ipsets are already on this host (left by a run that was killed?): "
            f"{', '.join(stale[:8])}; remove them before starting another"
        )
    argv = router_argv(binary=binary, kubeconfig=kubeconfig, node=node, service_range=service_range)
    engine = KubeRouter(proc=spawn("kube-router", argv, logdir=logdir), before=before)
    atexit.register(engine.stop)
    deadline = time.monotonic() + timeout
    try:
        while not firewall_ready(netfilter.snapshot()):
            if not engine.alive():
                raise KubeRouterError(
                    f"kube-router exited with code {engine.proc.popen.returncode}; last log lines:\n"
                    f"{engine.proc.tail()}"
                )
            if time.monotonic() > deadline:
                raise KubeRouterError(
                    f"kube-router set no firewall up in {timeout:.0f} s:\n{engine.proc.tail()}"
                )
            time.sleep(0.2)
    except BaseException:
        engine.stop(grace=2.0)
        raise
    return engine


def start_for(cluster: LocalCluster, *, binary: Path, timeout: float = 60.0) -> KubeRouter:
    """:func:`start_kube_router` for a local cluster's real node (its admin kubeconfig)."""
    real = cluster.real
    if real is None or real.layout is None or cluster.real_node is None:
        raise KubeRouterError("kube-router needs the local cluster's real node")
    return start_kube_router(
        binary=binary,
        kubeconfig=cluster.kubeconfig,
        node=cluster.real_node,
        service_range=real.layout.service_range,
        logdir=cluster.workdir,
        timeout=timeout,
    )
