"""Start and stop the local control plane as child processes.

``LocalCluster(workdir).start()`` runs etcd, kube-apiserver (RBAC on, client-certificate admin,
service-account signing keys), kube-controller-manager, kube-scheduler and kwok, waits until each
is ready, writes an admin kubeconfig and creates the kwok nodes (Pods on them are simulated).

With ``node="real"`` (or ``"auto"`` on a machine that allows it, see
:func:`~nymph.localcluster.realnode.real_node_support`) it also runs a real node
(:class:`~nymph.localcluster.realnode.RealNode`: containerd + kubelet + a bridge) on which Pods
really run; the API server then listens on the node's bridge IP (port 443 when free), which is
also the ``kubernetes`` Service's ClusterIP, so in-cluster clients reach it without kube-proxy.
Kwok nodes may sit beside the real one. ``node_kind`` says what started and ``node_note`` why.

``stop()`` (also on ``with`` exit and at interpreter exit) terminates every child and sweeps what
the real node left (see :mod:`nymph.localcluster.host`); each child also gets SIGKILL from the
kernel if this process dies (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import TracebackType
from typing import Any

from nymph.errors import NymphError
from nymph.kube.binaries import kubectl_path
from nymph.localcluster import flags
from nymph.localcluster.apierror import ApiAnswerError
from nymph.localcluster.assets import find_assets
from nymph.localcluster.certs import PKI, make_pki
from nymph.localcluster.clusterdns import ClusterDNS, endpoints_lookup
from nymph.localcluster.flags import KWOK_NODE_ANNOTATION
from nymph.localcluster.kubeconfig import cert_kubeconfig, token_kubeconfig
from nymph.localcluster.kuberay import KubeRayOperator, start_for
from nymph.localcluster.procs import (
    Proc,
    ProcessesSurvived,
    Restarter,
    free_port,
    port_free,
    spawn,
    stop_all,
)
from nymph.localcluster.realnode import NodeImage, RealNode, real_node_support

DEFAULT_NODE = "nymph-node-1"
NODE_KINDS = ("kwok", "real", "auto")

__all__ = ["DEFAULT_NODE", "ClusterStartError", "LocalCluster", "free_port", "kubectl_path"]


class ClusterStartError(NymphError):
    pass


def stages_file() -> Path:
    return Path(str(resources.files("nymph.localcluster") / "stages.yaml"))


def choose_node_kind(requested: str, assets: Path) -> tuple[str, str]:
    """(``"real"`` or ``"kwok"``, why) for a requested kind (``kwok``, ``real``, ``auto``)."""
    if requested not in NODE_KINDS:
        raise ClusterStartError(f"node kind {requested!r} is not one of {', '.join(NODE_KINDS)}")
    if requested == "kwok":
        return "kwok", "kwok node requested: Pods are simulated"
    reason = real_node_support(assets)
    if reason is None:
        return "real", "real node: Pods run in containers (containerd + kubelet)"
    if requested == "real":
        raise ClusterStartError(f"a real node was requested but {reason}")
    return "kwok", f"no real node ({reason}): Pods are simulated by kwok"


@dataclass
class LocalCluster:
    workdir: Path
    assets: Path | None = None
    node_names: Sequence[str] = (DEFAULT_NODE,)
    controller_manager: bool = True
    progress: Callable[[str], None] | None = None
    #: called before each control-plane process is started and at each turn of the start's
    #: waits: a caller's way to stop the start there (it raises), e.g. an interrupt that an
    #: earlier step swallowed
    checkpoint: Callable[[], None] | None = None
    #: called first thing in :meth:`stop` (e.g. so that a Ctrl-C from then on does not cut the
    #: stop short)
    on_stop: Callable[[], None] | None = None
    node: str = "kwok"
    images: Sequence[NodeImage] | None = None
    #: KubeletConfiguration fields over the real node's defaults (e.g. log rotation).
    kubelet_settings: Mapping[str, object] = field(default_factory=dict)
    #: Pods each kwok node admits at once (a kubelet's default is 110; a benchmark's burst of
    #: short jobs needs more, or it measures the node's Pod slots instead of dispatch).
    kwok_max_pods: int = 110
    #: a cluster DNS for the real node's Pods (:mod:`nymph.localcluster.clusterdns`)
    cluster_dns: bool = False
    dns: ClusterDNS | None = None
    procs: list[Proc] = field(default_factory=list)
    server: str = ""
    kubeconfig: Path = field(init=False)
    pki: PKI | None = None
    start_seconds: float = 0.0
    node_kind: str = ""
    node_note: str = ""
    real: RealNode | None = None
    api_host: str = "127.0.0.1"
    api_port: int = 0
    leftovers: list[str] = field(default_factory=list)
    #: starts kwok again when it dies (see :class:`~nymph.localcluster.procs.Restarter`)
    kwok: Restarter | None = None

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir)
        self.kubeconfig = self.workdir / "admin.kubeconfig"

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _say(self, msg: str) -> None:
        if self.progress:
            self.progress(msg)

    @property
    def real_node(self) -> str | None:
        """The real node's name, when one runs."""
        return self.real.name if self.real else None

    @property
    def node_image_names(self) -> list[str]:
        """Images present on the real node (the local pause and python images)."""
        return list(self.real.image_names) if self.real else []

    @property
    def in_cluster_env(self) -> dict[str, str]:
        """What an in-cluster client needs to reach the API server from a Pod on the real node."""
        return {"KUBERNETES_SERVICE_HOST": self.api_host, "KUBERNETES_SERVICE_PORT": str(self.api_port)}

    def start(self, *, timeout: float = 180.0) -> LocalCluster:
        t0 = time.monotonic()
        assets = self.assets or find_assets()
        self.node_kind, self.node_note = choose_node_kind(self.node, assets)
        self._say(self.node_note)
        self.workdir.mkdir(parents=True, exist_ok=True)
        atexit.register(self.stop)
        try:
            self._start(assets, timeout=timeout)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def _start(self, assets: Path, *, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        service_range = "10.0.0.0/24"
        if self.node_kind == "real":
            self.real = RealNode(
                assets=assets,
                logdir=self.workdir,
                images=self.images,
                progress=self.progress,
                kubelet_settings=self.kubelet_settings,
            )
            layout = self.real.prepare()
            self.api_host, service_range = layout.node_ip, layout.service_range
            self.api_port = 443 if port_free(layout.node_ip, 443) else free_port()
        else:
            self.api_port = free_port()
        deadline = time.monotonic() + timeout  # images may have been built above
        self._say("generating certificates")
        node_name = self.real.name if self.real else None
        extra = (self.api_host,) if self.real else ()
        pki = self.pki = make_pki(self.workdir / "pki", extra_ips=extra, node=node_name)

        etcd_port = free_port()
        self._say(f"starting etcd on 127.0.0.1:{etcd_port}")
        etcd = flags.etcd(assets, data_dir=self.workdir / "etcd", port=etcd_port, peer_port=free_port())
        self._spawn("etcd", etcd)
        self._wait(f"http://127.0.0.1:{etcd_port}/health", "etcd", deadline, ok=lambda b: b'"true"' in b)

        self.server = f"https://{self.api_host}:{self.api_port}"
        self._say(f"starting kube-apiserver on {self.server}")
        apiserver = flags.apiserver(
            assets,
            pki=pki,
            etcd_port=etcd_port,
            host=self.api_host,
            port=self.api_port,
            cert_dir=self.workdir / "apiserver-certs",
            service_range=service_range,
        )
        self._spawn("kube-apiserver", apiserver)
        cert_kubeconfig(
            self.kubeconfig,
            server=self.server,
            ca_cert=pki.ca_cert,
            cert=pki.admin_cert,
            key=pki.admin_key,
            user="nymph-admin",
        )
        self._wait(f"{self.server}/readyz", "kube-apiserver", deadline, ok=lambda b: b.strip() == b"ok")
        kc = self.kubeconfig
        if self.controller_manager:
            self._say("starting kube-controller-manager")
            self._spawn(
                "kube-controller-manager",
                flags.controller_manager(assets, pki=pki, kubeconfig=kc, port=free_port()),
            )
        self._say("starting kube-scheduler")
        self._spawn("kube-scheduler", flags.scheduler(assets, kubeconfig=kc, port=free_port()))
        if self.real:
            if self.cluster_dns:
                self.dns = ClusterDNS(listen=self.api_host, lookup=endpoints_lookup(self.api)).start()
                self.real.kubelet_settings = {**self.real.kubelet_settings, **self.dns.kubelet_settings()}
            self.real.start(server=self.server, pki=pki, deadline=deadline)
        if self.node_kind == "kwok" or self.node_names:
            self._say("starting kwok")
            self.kwok = Restarter(
                "kwok",
                flags.kwok(assets, kubeconfig=kc, stages=stages_file(), port=free_port()),
                logdir=self.workdir,
                procs=self.procs,
                say=self._say,
                before_restart=self._release_kwok_leases,
            )
        for node in self.node_names:
            self.create_node(node)
        self._wait_node_ready(deadline)
        if self.controller_manager:
            self._wait_default_sa("default", deadline)

    def stop(self) -> None:
        if self.on_stop:
            self.on_stop()
        if self.procs:
            self._say("stopping the cluster")
        # kubelet and containerd first, the control plane next, and the node's sweep last: the
        # API server listens on the node's bridge, and hangs in its shutdown if that goes first.
        # A process that outlives its SIGKILL is a leftover, and the steps after it still run.
        if self.real is not None:
            try:
                self.real.stop_processes()
            except ProcessesSurvived as exc:
                self.leftovers.append(str(exc))
        if self.kwok is not None:
            self.kwok.stop()
        procs, self.procs = self.procs, []
        try:
            stop_all(procs)
        except ProcessesSurvived as exc:
            self.leftovers.append(str(exc))
        if self.dns is not None:
            self.dns.stop()
        if self.real is not None:
            self.leftovers.extend(self.real.stop())  # a second stop() finds nothing more
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)

    def start_kuberay(self, *, binary: Path, crds: Path, timeout: float = 120.0) -> KubeRayOperator:
        """Apply the KubeRay CRDs and start its operator as one of this cluster's processes
        (stopped first by :meth:`stop`); see :mod:`nymph.localcluster.kuberay`."""
        self._say("starting the KubeRay operator")
        op = start_for(self, binary=binary, crds=crds, timeout=timeout)
        self.procs.append(op.proc)
        return op

    # -- helpers ---------------------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str]) -> None:
        if self.checkpoint:
            self.checkpoint()
        self.procs.append(spawn(name, argv, logdir=self.workdir))

    def _check_alive(self) -> None:
        if self.checkpoint:
            self.checkpoint()
        for p in list(self.procs):
            if self.kwok is not None and self.kwok.replaced(p):
                continue  # started again by its Restarter
            code = p.popen.poll()
            if code is not None:
                raise ClusterStartError(f"{p.name} exited with code {code}; last log lines:\n{p.tail()}")
        if self.real:
            self.real.check_alive()

    def ssl_context(self) -> ssl.SSLContext:
        assert self.pki is not None
        ctx = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        ctx.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        return ctx

    def _wait(self, url: str, what: str, deadline: float, *, ok: Callable[[bytes], bool]) -> None:
        ctx = self.ssl_context() if url.startswith("https") else None
        last = ""
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:  # noqa: S310
                    body = resp.read()
                    if ok(body):
                        return
                    last = body[:200].decode(errors="replace")
            except (urllib.error.URLError, OSError) as exc:
                last = str(exc)
            time.sleep(0.2)
        raise ClusterStartError(f"{what} not ready in time ({last})")

    def kubeconfig_for_token(self, token: str, path: Path, *, namespace: str = "default") -> Path:
        """A kubeconfig that authenticates with a bearer token (e.g. a ServiceAccount's)."""
        assert self.pki is not None
        return token_kubeconfig(
            path, server=self.server, ca_cert=self.pki.ca_cert, token=token, namespace=namespace
        )

    def api(self, method: str, path: str, body: Any = None, *, content_type: str = "application/json") -> Any:
        """A small admin request helper (JSON in, JSON out) for set-up code; an HTTP error
        answer raises :class:`ApiAnswerError`."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)  # noqa: S310
        req.add_header("Content-Type", content_type)
        req.add_header("Accept", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=30, context=self.ssl_context()) as resp:  # noqa: S310
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            raise ApiAnswerError(f"{method} {path}: HTTP {exc.code}: {detail}", status=exc.code) from None
        return json.loads(raw) if raw else None

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [kubectl_path(), f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check and proc.returncode != 0:
            raise NymphError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc

    def _release_kwok_leases(self) -> None:
        """Delete the leases of the kwok nodes: a kwok that died held them, and a new one (a new
        holder identity) would simulate nothing on those nodes until they ran out."""
        nodes = self.api("GET", "/api/v1/nodes")["items"]
        for node in nodes:
            if node["metadata"].get("annotations", {}).get(KWOK_NODE_ANNOTATION) != "fake":
                continue
            name = node["metadata"]["name"]
            with contextlib.suppress(NymphError):  # already gone
                self.api("DELETE", f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}")

    def create_node(self, name: str) -> None:
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {KWOK_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "type": "kwok",
                },
            },
            "status": {
                "allocatable": {
                    "cpu": "32",
                    "memory": "256Gi",
                    "pods": str(self.kwok_max_pods),
                    "nvidia.com/gpu": "8",
                    "ephemeral-storage": "1Ti",
                },
                "capacity": {
                    "cpu": "32",
                    "memory": "256Gi",
                    "pods": str(self.kwok_max_pods),
                    "nvidia.com/gpu": "8",
                    "ephemeral-storage": "1Ti",
                },
            },
        }
        try:
            self.api("POST", "/api/v1/nodes", node)
        except NymphError as exc:
            if "409" not in str(exc):
                raise

    def _wait_node_ready(self, deadline: float) -> None:
        names = [*self.node_names, *([self.real.name] if self.real else [])]
        pending = set(names)
        while time.monotonic() < deadline:
            self._check_alive()
            for name in sorted(pending):
                try:
                    node = self.api("GET", f"/api/v1/nodes/{name}")
                except NymphError:
                    continue  # the kubelet has not registered yet
                conds = (node.get("status") or {}).get("conditions") or []
                if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds):
                    pending.discard(name)
            if not pending:
                # The TaintNodesByCondition admission plugin taints every new node not-ready;
                # the node lifecycle controller would lift it, but it also evicts on missed
                # heartbeats, so it stays off and the taint is lifted here once the node is Ready.
                for name in names:
                    self.api(
                        "PATCH",
                        f"/api/v1/nodes/{name}",
                        {"spec": {"taints": None}},
                        content_type="application/merge-patch+json",
                    )
                return
            time.sleep(0.3)
        raise ClusterStartError(f"node(s) {', '.join(sorted(pending))} not Ready in time")

    def _wait_default_sa(self, namespace: str, deadline: float) -> None:
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                self.api("GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
                return
            except NymphError:
                time.sleep(0.3)
        raise ClusterStartError(f"no default ServiceAccount in {namespace} in time")

    def wait_default_sa(self, namespace: str, timeout: float = 90.0) -> None:
        # The controller manager makes the account; on a loaded machine it has taken over 30 s.
        self._wait_default_sa(namespace, time.monotonic() + timeout)
