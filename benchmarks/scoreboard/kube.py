"""The API server side of the benchmark: a watch that timestamps Pod ADDED events, and the raw
baseline (Pods created by a tight kubernetes_asyncio client, serially and concurrently)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, watch

from benchmarks.scoreboard import procstat
from nymph.errors import NymphError
from nymph.launch.render import render_pod
from nymph.launch.spec import LaunchSpec
from nymph.localcluster import LocalCluster
from nymph.localcluster.apierror import ApiAnswerError
from nymph.queue.auth import create_token
from nymph.queue.db import connect, transaction
from nymph.queue.models import Role
from tests.support.harness import QueueProc

#: kwok keeps a Pod with this label Running for this long, then it Succeeds.
RUN_LABEL = "sim.nymph.io/run"


def pct(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile, ``None`` for no values."""
    if not values:
        return None
    s = sorted(values)
    return round(s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))], 1)


def latency_summary(ms: list[float]) -> dict[str, Any]:
    return {"p50_ms": pct(ms, 50), "p95_ms": pct(ms, 95), "p99_ms": pct(ms, 99), "samples": len(ms)}


class AddedWatch:
    """Watches a namespace and records when each Pod was first seen ADDED."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.seen: dict[str, float] = {}
        self.changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    async def __aenter__(self) -> AddedWatch:
        self._task = asyncio.create_task(self._run())
        await asyncio.wait_for(self._ready.wait(), 30)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def _run(self) -> None:
        v1 = client.CoreV1Api(self.api)
        listed = await v1.list_namespaced_pod(self.namespace, _preload_content=False)
        rv = json.loads(await listed.read())["metadata"]["resourceVersion"]
        self._ready.set()
        while True:
            w = watch.Watch()
            async with w:
                async for ev in w.stream(
                    v1.list_namespaced_pod,
                    namespace=self.namespace,
                    resource_version=rv,
                    timeout_seconds=600,
                    allow_watch_bookmarks=True,
                ):
                    obj = ev["raw_object"]
                    rv = obj.get("metadata", {}).get("resourceVersion", rv)
                    if ev["type"] == "ADDED":
                        name = obj["metadata"]["name"]
                        if name not in self.seen:
                            self.seen[name] = time.monotonic()
                            async with self.changed:
                                self.changed.notify_all()

    async def wait_for(self, names: set[str] | None = None, *, count: int = 0, timeout: float = 600) -> float:
        """Wait until every name (or ``count`` Pods) has been seen; the time of the last one."""

        def done() -> bool:
            if names is not None:
                return names <= self.seen.keys()
            return len(self.seen) >= count

        async with self.changed:
            await asyncio.wait_for(self.changed.wait_for(done), timeout)
        wanted = names if names is not None else set(self.seen)
        return max(self.seen[n] for n in wanted)


def raw_pod(*, namespace: str, index: int, node: str, run: str) -> dict[str, Any]:
    """A Pod rendered exactly as nymph renders a launch (same size, labels, workdir volume)."""
    spec = LaunchSpec.from_json(
        {
            "instanceId": f"lakeshore-{index:08x}",
            "provider": "local",
            "ownerNamespace": "default",
            "namespace": namespace,
            "image": "python:3.12-slim",
            "script": "print(1)\n",
            "labels": [[RUN_LABEL, run]],
        }
    )
    return dict(render_pod(spec, node=node, workdir_root="/var/lib/nymph"))


async def raw_create(
    kube: LocalCluster,
    *,
    namespace: str,
    n: int,
    concurrency: int,
    node: str,
    run: str,
    start: int = 0,
    settle_seconds: float = 30.0,
    rate: float | None = None,
) -> dict[str, Any]:
    """Create ``n`` Pods with ``concurrency`` workers, each as fast as the server answers (with
    ``rate``: the i-th create starts no sooner than i / ``rate`` seconds after the first);
    creates/s from the first request to the last ADDED event, and per-create latency."""
    api = await make_api(kube)
    v1 = client.CoreV1Api(api)
    bodies = [raw_pod(namespace=namespace, index=start + i, node=node, run=run) for i in range(n)]
    lat: list[float] = []
    added: list[float] = []
    queue: asyncio.Queue[tuple[int, dict[str, Any]]] = asyncio.Queue()
    for i, b in enumerate(bodies):
        queue.put_nowait((i, b))
    try:
        async with AddedWatch(api, namespace) as watcher:

            async def worker() -> None:
                while not queue.empty():
                    i, body = queue.get_nowait()
                    if rate:
                        await asyncio.sleep(t0 + i / rate - time.monotonic())
                    t = time.monotonic()
                    resp = await v1.create_namespaced_pod(namespace, body, _preload_content=False)
                    await resp.read()
                    lat.append((time.monotonic() - t) * 1000)

            pids = {p.name: p.popen.pid for p in kube.procs}
            before = procstat.snapshot(pids)
            t0 = time.monotonic()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            t_end = await watcher.wait_for({b["metadata"]["name"] for b in bodies})
            window = procstat.cpu_delta(before, procstat.snapshot(pids))
            added = [(watcher.seen[b["metadata"]["name"]] - t0) for b in bodies]
            await _quiet(pids, seconds=settle_seconds)
            life = procstat.cpu_delta(before, procstat.snapshot(pids))
    finally:
        await api.close()
    return {
        "launches": n,
        "concurrency": concurrency,
        **({"paced_per_s": rate} if rate else {}),
        "per_s": round(n / (t_end - t0), 2),
        "create_p50_ms": pct(lat, 50),
        "create_p95_ms": pct(lat, 95),
        "last_added_s": round(max(added), 3),
        # The control plane's CPU per Pod until the last ADDED, and over the Pods' lives (until
        # the control plane is quiet again: scheduling, kwok's status updates, the watches).
        "cpu_ms_per_launch": {k: round(v * 1000 / n, 2) for k, v in window.items()},
        # The cores each process used over that window (CPU-seconds a second).
        "cores": {k: round(v / (t_end - t0), 2) for k, v in window.items()},
        "cpu_ms_per_pod_life": {k: round(v * 1000 / n, 2) for k, v in life.items()},
    }


async def _quiet(pids: dict[str, int], *, seconds: float, quiet_cpu: float = 0.1) -> None:
    """Wait (at most ``seconds``) until ``pids`` spend under ``quiet_cpu`` CPU-seconds a second."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        before = procstat.snapshot(pids)
        await asyncio.sleep(1.0)
        if sum(procstat.cpu_delta(before, procstat.snapshot(pids)).values()) < quiet_cpu:
            return


async def raw_latency(kube: LocalCluster, *, namespace: str, n: int, node: str, run: str) -> dict[str, Any]:
    """One create at a time: the create call's latency, and request start -> ADDED."""
    api = await make_api(kube)
    v1 = client.CoreV1Api(api)
    create: list[float] = []
    to_added: list[float] = []
    try:
        async with AddedWatch(api, namespace) as watcher:
            for i in range(n):
                body = raw_pod(namespace=namespace, index=0x7000000 + i, node=node, run=run)
                name = body["metadata"]["name"]
                t = time.monotonic()
                resp = await v1.create_namespaced_pod(namespace, body, _preload_content=False)
                await resp.read()
                create.append((time.monotonic() - t) * 1000)
                seen = await watcher.wait_for({name}, timeout=60)
                to_added.append((seen - t) * 1000)
    finally:
        await api.close()
    return {"create": latency_summary(create), "to_added": latency_summary(to_added)}


async def make_api(kube: LocalCluster) -> client.ApiClient:
    from nymph.kube.api import make_api_client

    return await make_api_client(kubeconfig=str(kube.kubeconfig))


def make_namespace(kube: LocalCluster, name: str) -> str:
    kube.api("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    kube.wait_default_sa(name)
    return name


async def drop_namespace(kube: LocalCluster, name: str, *, timeout: float = 300.0) -> float:
    """Delete namespace ``name`` and wait until it and its Pods are gone: the seconds it took.
    Each path of the benchmark then starts on the cluster the raw run measured, not on the
    thousands of finished Pods the paths before it left (on a node that keeps them, each Pod
    event costs the API server and the node more the more Pods there are)."""
    t0 = time.monotonic()
    try:
        await asyncio.to_thread(kube.api, "DELETE", f"/api/v1/namespaces/{name}")
    except ApiAnswerError as exc:
        if exc.status != 404:  # 404: already gone
            raise
    while time.monotonic() - t0 < timeout:
        try:
            await asyncio.to_thread(kube.api, "GET", f"/api/v1/namespaces/{name}")
        except ApiAnswerError as exc:
            if exc.status == 404:
                return time.monotonic() - t0
            raise
        await asyncio.sleep(1.0)
    raise NymphError(f"namespace {name} was not gone {timeout:.0f} s after its deletion")


def new_queue(db: Path, *, extra: tuple[str, ...] = ()) -> QueueProc:
    """A started queue with a user and a daemon token (made in this process: no CLI start-up);
    ``extra``: more ``queue serve`` flags."""
    conn = connect(db)
    try:
        with transaction(conn, write=True):
            q = QueueProc(db, extra=extra)
            q.user_token = create_token(conn, role=Role.USER).token
            q.daemon_token = create_token(conn, role=Role.DAEMON).token
    finally:
        conn.close()
    return q.start()


def server_version(kube: LocalCluster) -> str:
    try:
        return str(kube.api("GET", "/version").get("gitVersion", ""))
    except Exception:
        return ""
