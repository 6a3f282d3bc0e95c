"""Run the real queue service and the real daemon as subprocesses against the local cluster."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from nymph.client import QueueClient
from nymph.localcluster import LocalCluster
from nymph.localcluster.cluster import free_port
from tests.support.hygiene_plugin import stop_process, track

REPO = Path(__file__).resolve().parents[2]
DAEMON_ROLE = REPO / "manifests" / "base" / "daemon-role.yaml"
DOCKYARD_ROLE = REPO / "manifests" / "base" / "daemon-dockyard-role.yaml"
NODE = "nymph-node-1"


def nymph(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120, check: bool = False
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nymph.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=check,
    )


def wait_http(url: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"{url} not up in {timeout}s")


def _popen(args: list[str], *, log: Any, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start a service in its own session (so its whole group can be killed) and track it, so
    it is killed when the test ends, pass or fail."""
    return track(
        subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    )


@dataclass
class QueueProc:
    #: A SQLite file, or a PostgreSQL URL (then ``log_dir`` says where the log goes).
    db: Path | str
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    user_token: str = ""
    daemon_token: str = ""
    extra: tuple[str, ...] = ()
    log_dir: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def tokens(self) -> None:
        def make(role: str) -> str:
            out = nymph("queue", "token", "create", "--db", str(self.db), "--role", role, check=True).stdout
            return out.strip().splitlines()[-1].split()[-1]

        self.user_token = make("user")
        self.daemon_token = make("daemon")

    def start(self) -> QueueProc:
        log_dir = self.log_dir or Path(self.db).parent
        with (log_dir / "queue.log").open("ab") as log:
            self.proc = _popen(
                [
                    sys.executable,
                    "-m",
                    "nymph.cli",
                    "queue",
                    "serve",
                    "--db",
                    str(self.db),
                    "--listen",
                    f"127.0.0.1:{self.port}",
                    *self.extra,
                ],
                log=log,
            )
        try:
            wait_http(f"{self.url}/healthz")
        except BaseException:  # never up, or stopped meanwhile: it is not left running
            self.kill()
            raise
        return self

    def kill(self) -> None:
        if self.proc:
            stop_process(self.proc)

    def stop(self) -> None:
        if self.proc:
            stop_process(self.proc, sig=signal.SIGTERM)

    def user_env(self) -> dict[str, str]:
        return {"NYMPH_URL": self.url, "NYMPH_TOKEN": self.user_token}

    def client(self) -> QueueClient:
        return QueueClient(base_url=self.url, token=self.user_token)


@dataclass
class DaemonProc:
    queue: QueueProc
    kubeconfig: Path
    namespace: str
    root: Path
    extra: tuple[str, ...] = ()
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    #: Extra environment (the benchmark runs kubectl as the deployed Pod would).
    env: dict[str, str] = field(default_factory=dict)
    node: str = NODE

    def start(self) -> DaemonProc:
        with (self.root.parent / f"daemon-{self.root.name}.log").open("ab") as log:
            self.proc = _popen(
                [
                    sys.executable,
                    "-m",
                    "nymph.cli",
                    "--log-format",
                    "json",
                    "daemon",
                    "--queue",
                    self.queue.url,
                    "--node",
                    self.node,
                    "--namespace",
                    self.namespace,
                    "--kubeconfig",
                    str(self.kubeconfig),
                    "--workdir-root",
                    str(self.root),
                    "--listen",
                    f"127.0.0.1:{self.port}",
                    "--poll-wait",
                    "5",
                    "--lease-seconds",
                    "6",
                    *self.extra,
                ],
                log=log,
                env={**os.environ, **self.env, "NYMPH_TOKEN": self.queue.daemon_token},
            )
        wait_http(f"http://127.0.0.1:{self.port}/healthz")
        return self

    def kill(self) -> None:
        """SIGKILL the daemon and everything in its process group (its kubectl children too)."""
        if self.proc:
            stop_process(self.proc)

    def terminate(self, timeout: float = 40) -> int:
        assert self.proc is not None
        self.proc.terminate()
        try:
            return self.proc.wait(timeout)
        finally:
            stop_process(self.proc)  # and whatever it left in its group

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            return r.read().decode()


def daemon_kubeconfig(kube: LocalCluster, namespace: str, tmp: Path, *, dockyard: bool = False) -> Path:
    """A ServiceAccount bound to exactly the project's daemon Role (and, with ``dockyard``, the
    dockyard Role too), and a kubeconfig for it."""
    from tests.support.kube_fixtures import token_kubeconfig

    kube.api(
        "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": "nymph-daemon"}}
    )
    for manifest in (DAEMON_ROLE, DOCKYARD_ROLE) if dockyard else (DAEMON_ROLE,):
        _bind_role(kube, namespace, yaml.safe_load(manifest.read_text()))
    return token_kubeconfig(kube, namespace=namespace, name="nymph-daemon", path=tmp / "daemon.kubeconfig")


def _bind_role(kube: LocalCluster, namespace: str, role: dict[str, Any]) -> None:
    name = role["metadata"]["name"]
    base = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    kube.api("POST", f"{base}/roles", {"metadata": {"name": name}, "rules": role["rules"]})
    kube.api(
        "POST",
        f"{base}/rolebindings",
        {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": "nymph-daemon", "namespace": namespace}],
        },
    )


async def setup_provider(q: QueueProc, namespace: str, *, image: str = "python:3.12-slim") -> None:
    async with q.client() as c:
        await c.create_provider(
            name="local", launcher="Kube", kwargs={"namespace": namespace}, dispatch="daemon"
        )
        await c.create_mode(name="py", provider="local", fields={"image": image})


async def launch(q: QueueProc, *, tags: dict[str, str] | None = None, script: str = "print('hi')\n") -> str:
    async with q.client() as c:
        accepted = await c.launch(provider="local", mode="py", script=script, tags=tags or {})
        return str(accepted["instanceId"])


async def wait_state(q: QueueProc, iid: str, states: set[str], timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    async with q.client() as c:
        while True:
            inst = dict(await c.get_instance(provider="local", instance_id=iid))
            if inst["state"] in states:
                return inst
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{iid} stuck in {inst['state']} (wanted {states}): {inst.get('history')}"
                )
            await asyncio.sleep(0.2)


def pods(kube: LocalCluster, namespace: str) -> list[dict[str, Any]]:
    return list(
        kube.api("GET", f"/api/v1/namespaces/{namespace}/pods?labelSelector=lakeshore%3Dtrue")["items"]
    )


@contextlib.contextmanager
def running(*procs: Any) -> Any:
    try:
        yield
    finally:
        for p in procs:
            with contextlib.suppress(Exception):
                p.kill()


@contextlib.asynccontextmanager
async def running_watch(watcher: Any, api: Any) -> Any:
    """Run a :class:`nymph.kube.watch.PodWatcher` for the block; then stop it and close ``api``."""
    task = asyncio.create_task(watcher.run(), name="test-pod-watch")
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api.close()
