"""What a daemon costs: idle (RSS, CPU, queue requests per minute, counted by a proxy in
front of the queue), RSS over a long soak, and one kubectl invocation as the deployed daemon
runs it (read-only home: no discovery cache) against one with a writable cache."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import resource
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from benchmarks.scoreboard import procstat
from benchmarks.scoreboard.kube import RUN_LABEL, latency_summary, make_namespace, new_queue, raw_pod
from benchmarks.scoreboard.nymph_run import DEPLOYED_ENV, Config, Stack
from nymph.kube.binaries import kubectl_path
from nymph.kube.kubectl import GO_RUNTIME_ENV
from nymph.localcluster import LocalCluster
from nymph.localcluster.cluster import free_port
from tests.support.harness import NODE, DaemonProc

_HOP = {"host", "content-length", "transfer-encoding", "connection", "content-encoding", "keep-alive"}


class CountingProxy:
    """Forwards every request to the queue and counts them by path."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.counts: collections.Counter[str] = collections.Counter()
        self.port = free_port()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _forward(self, request: web.Request) -> web.Response:
        self.counts[request.path] += 1
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        try:
            async with self._session.request(
                request.method, self.target + request.path_qs, data=await request.read(), headers=headers
            ) as r:
                body = await r.read()
                out = {k: v for k, v in r.headers.items() if k.lower() not in _HOP}
                return web.Response(status=r.status, body=body, headers=out)
        except aiohttp.ClientError:
            return web.Response(status=502)  # the queue went away (the end of the measurement)

    async def __aenter__(self) -> CountingProxy:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        # Held long-polls are cut at exit, not waited for.
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()


@dataclass
class _Proxied:
    """What DaemonProc reads from its queue: the URL (the proxy's) and the daemon token."""

    url: str
    daemon_token: str


async def idle(kube: LocalCluster, tmp: Path, *, warmup: float, seconds: float) -> dict[str, Any]:
    """A daemon with its default settings and nothing to do."""
    home = tmp / "idle"
    home.mkdir(parents=True, exist_ok=True)
    ns = make_namespace(kube, "bench-idle")
    q = new_queue(home / "queue.db")
    d: DaemonProc | None = None
    try:
        async with q.client() as c:
            await c.create_provider(name="local", kwargs={"namespace": ns}, dispatch="daemon")
        async with CountingProxy(q.url) as proxy:
            d = DaemonProc(
                _Proxied(proxy.url, q.daemon_token),  # type: ignore[arg-type]
                kube.kubeconfig,
                ns,
                home / "root",
                extra=("--poll-wait", "30", "--lease-seconds", "60"),
                env=dict(DEPLOYED_ENV),
            )
            d.start()
            assert d.proc is not None
            pid = {"daemon": d.proc.pid}
            await asyncio.sleep(warmup)
            proxy.counts.clear()
            before = procstat.snapshot(pid)
            t0 = time.monotonic()
            await asyncio.sleep(seconds)
            elapsed = time.monotonic() - t0
            spent = procstat.cpu_delta(before, procstat.snapshot(pid))
            mem = procstat.memory_kb(d.proc.pid)
            counts = dict(proxy.counts)
            d.kill()
            q.kill()
    finally:
        if d is not None:
            d.kill()
        q.kill()
    minutes = elapsed / 60
    return {
        "seconds": round(elapsed, 1),
        "rss_mb": round(mem.get("VmRSS", 0) / 1024, 1),
        "cpu_pct_of_core": round(100 * (spent["daemon"] + spent["kubectl"]) / elapsed, 2),
        "cpu_s_per_min": round((spent["daemon"] + spent["kubectl"]) / minutes, 3),
        "queue_requests_per_min": round(sum(counts.values()) / minutes, 2),
        "queue_requests": counts,
    }


async def soak(kube: LocalCluster, tmp: Path, *, launches: int, step: int, run: str) -> dict[str, Any]:
    """RSS of a daemon (default kubectl apply) after every ``step`` launches, up to ``launches``."""
    config = Config("soak", ("--concurrency", "8"))
    rss: dict[str, float] = {}
    async with Stack(kube, tmp, config, run=run, reap_after=5) as stack:
        rss["0"] = round(stack.daemon_memory().get("VmRSS", 0) / 1024, 1)
        done = 0
        while done < launches:
            n = min(step, launches - done)
            await stack.throughput(n, posters=8)
            done += n
            rss[str(done)] = round(stack.daemon_memory().get("VmRSS", 0) / 1024, 1)
            print(f"  soak: {done} launches, daemon RSS {rss[str(done)]} MB", flush=True)
    first = rss[str(min(step, launches))]
    return {
        "launches": launches,
        "rss_mb": rss,
        # From the first step (imports, caches and pools warm) to the end: a leak grows here.
        "rss_growth_pct": round(100 * (rss[str(launches)] - first) / first, 1) if first else None,
    }


def _kubectl(args: list[str], *, stdin: str, env: dict[str, str]) -> tuple[float, float, str]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.monotonic()
    out = subprocess.run(args, input=stdin, capture_output=True, text=True, env=env, timeout=120, check=False)
    wall = time.monotonic() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if out.returncode:
        raise RuntimeError(f"kubectl failed: {out.stderr[-500:]}")
    return wall * 1000, cpu * 1000, out.stderr


def kubectl_invocations(kube: LocalCluster, tmp: Path, *, n: int) -> dict[str, Any]:
    """``kubectl apply --server-side`` of one Pod, as the deployed daemon runs it (home not
    writable, so no discovery cache; Go's collector off, :data:`GO_RUNTIME_ENV`) and with a
    writable cache directory."""
    ns = make_namespace(kube, "bench-kubectl")
    base = [kubectl_path(), f"--kubeconfig={kube.kubeconfig}", "--request-timeout=60s"]
    apply = [*base, "apply", "--server-side", "--field-manager=nymph", "-o", "json", "-f", "-"]
    cache = tmp / "kubectl-cache"
    envs = {
        "read_only_home": {**os.environ, **GO_RUNTIME_ENV, **DEPLOYED_ENV},
        "cache_dir": {**os.environ, **GO_RUNTIME_ENV, **DEPLOYED_ENV, "KUBECACHEDIR": str(cache)},
    }
    out: dict[str, Any] = {}
    index = 0x7F000000
    for label, env in envs.items():
        wall: list[float] = []
        cpu: list[float] = []
        requests = 0
        for i in range(n + 2):
            index += 1
            pod = json.dumps(raw_pod(namespace=ns, index=index, node=NODE, run="1s"))
            verbose = ["-v=6"] if i == n + 1 else []
            w, c, err = _kubectl([*apply[:1], *verbose, *apply[1:]], stdin=pod, env=env)
            if i == 0:
                continue  # the first run fills the cache (when there is one)
            if verbose:
                requests = sum(1 for line in err.splitlines() if '"Response" verb=' in line)
            else:
                wall.append(w)
                cpu.append(c)
        out[label] = {
            "wall": latency_summary(wall),
            "cpu_ms_mean": round(sum(cpu) / len(cpu), 1) if cpu else None,
            "api_requests": requests,
        }
    ro, cached = out["read_only_home"]["wall"]["p50_ms"], out["cache_dir"]["wall"]["p50_ms"]
    out["cache_speedup_ratio"] = round(ro / cached, 2) if ro and cached else None
    return out


__all__ = ["RUN_LABEL", "CountingProxy", "idle", "kubectl_invocations", "soak"]
