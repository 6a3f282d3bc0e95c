"""nymph end to end on the local control plane: a queue (and, on the daemon path, a daemon)
per configuration; throughput from the first POST to the last Pod ADDED, latency at low load,
and the CPU each process spent per launch."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from benchmarks.scoreboard import apicalls, procstat
from benchmarks.scoreboard.kube import (
    RUN_LABEL,
    AddedWatch,
    latency_summary,
    make_api,
    make_namespace,
    new_queue,
)
from nymph.localcluster import LocalCluster
from tests.support.harness import DaemonProc, QueueProc


@dataclass(frozen=True)
class Config:
    """One way of dispatching: ``direct`` (the queue creates the Pod) or a daemon with flags."""

    name: str
    daemon_flags: tuple[str, ...] | None  # None: direct dispatch, no daemon


def configs(*, concurrency: int) -> list[Config]:
    c = ("--concurrency", str(concurrency))
    return [
        Config("direct", None),
        # kubectl's own default: two runs of up to 64 in flight (a run costs little more for
        # 64 Pods than for one, and applies its Pods one after another).
        Config("kubectl_batched", ("--batch-max", "64")),
        Config("kubectl_single", (*c, "--batch-max", "1")),
        Config("api", (*c, "--apply-with", "api")),
    ]


#: The deployed DaemonSet has a read-only root filesystem: kubectl finds no writable home.
DEPLOYED_ENV = {"HOME": "/proc/nymph-read-only-home"}


@dataclass
class Stack:
    kube: LocalCluster
    tmp: Path
    config: Config
    run: str
    reap_after: float
    settle_seconds: float = 30.0
    queue: QueueProc | None = None
    daemon: DaemonProc | None = None
    namespace: str = ""
    pids: dict[str, int] = field(default_factory=dict)

    async def __aenter__(self) -> Stack:
        try:
            await self._start()
        except BaseException:  # a failed start (or a SIGTERM meanwhile) leaves nothing running
            await self.__aexit__()
            raise
        return self

    async def _start(self) -> None:
        name = self.config.name
        self.namespace = make_namespace(self.kube, namespace_of(name))
        home = self.tmp / name
        home.mkdir(parents=True, exist_ok=True)
        # the local cluster's API server is on this host: a user kubeconfig reaches it when allowed
        q = self.queue = new_queue(home / "queue.db", extra=("--kube-server-allow", self.kube.api_host))
        async with q.client() as c:
            if self.config.daemon_flags is None:
                kwargs = {"namespace": self.namespace, "kubeconfig": self.kube.kubeconfig.read_text()}
                await c.create_provider(name="local", kwargs=kwargs, dispatch="direct")
            else:
                await c.create_provider(name="local", kwargs={"namespace": self.namespace}, dispatch="daemon")
            await c.create_mode(name="py", provider="local", fields={"image": "python:3.12-slim"})
        assert q.proc is not None
        self.pids = {"queue": q.proc.pid, **{p.name: p.popen.pid for p in self.kube.procs}}
        if self.config.daemon_flags is not None:
            d = self.daemon = DaemonProc(
                q,
                self.kube.kubeconfig,
                self.namespace,
                home / "root",
                extra=("--reap-after", str(self.reap_after), "--poll-wait", "30", *self.config.daemon_flags),
                env=dict(DEPLOYED_ENV),
            )
            d.start()
            assert d.proc is not None
            self.pids["daemon"] = d.proc.pid
            await asyncio.sleep(1.0)  # its watch has listed, its first claim is held

    async def __aexit__(self, *exc: object) -> None:
        if self.daemon is not None:
            self.daemon.kill()
        if self.queue is not None:
            self.queue.kill()

    async def post(self, n: int, *, posters: int) -> dict[str, float]:
        """Post ``n`` launches from ``posters`` concurrent clients; instance id -> time posted."""
        assert self.queue is not None
        posted: dict[str, float] = {}
        left = [n]

        async def poster() -> None:
            assert self.queue is not None
            async with self.queue.client() as c:
                while left[0] > 0:
                    left[0] -= 1
                    acc = await c.launch(
                        provider="local", mode="py", script="print(1)\n", tags={RUN_LABEL: self.run}
                    )
                    posted[str(acc["instanceId"])] = time.monotonic()

        await asyncio.gather(*(poster() for _ in range(min(posters, n))))
        return posted

    async def settle(self, *, quiet_cpu: float = 0.05) -> None:
        """Wait until the queue and the daemon are idle (trailing reports and reaping done)."""
        deadline = time.monotonic() + self.settle_seconds
        names = {k: v for k, v in self.pids.items() if k in ("queue", "daemon")}
        while time.monotonic() < deadline:
            before = procstat.snapshot(names)
            await asyncio.sleep(1.0)
            spent = procstat.cpu_delta(before, procstat.snapshot(names))
            if sum(spent.values()) < quiet_cpu:
                return

    async def throughput(self, n: int, *, posters: int) -> dict[str, Any]:
        api = await make_api(self.kube)
        try:
            async with AddedWatch(api, self.namespace) as watcher:
                calls_before = await asyncio.to_thread(apicalls.request_counts, self.kube)
                applies_before = await self.applies()
                before = procstat.snapshot(self.pids)
                t0 = time.monotonic()
                posted = await self.post(n, posters=posters)
                t_posted = time.monotonic()
                t_end = await watcher.wait_for(set(posted))
                await self.settle()
                spent = procstat.cpu_delta(before, procstat.snapshot(self.pids))
                calls = await asyncio.to_thread(apicalls.request_counts, self.kube)
                applies = await self.applies()
        finally:
            await api.close()
        lat = [(watcher.seen[i] - posted[i]) * 1000 for i in posted]
        runs, manifests = (a - b for a, b in zip(applies, applies_before, strict=True))
        return {
            "launches": n,
            "per_s": round(n / (t_end - t0), 2),
            "post_per_s": round(n / max(t_posted - t0, 1e-6), 2),
            "posted_to_added": latency_summary(lat),
            "cpu_ms_per_launch": {k: round(v * 1000 / n, 2) for k, v in spent.items()},
            # every client's requests (nymph's, the scheduler's, kwok's, this benchmark's watch)
            "api_requests_per_launch": apicalls.per_launch(calls_before, calls, n),
            # the daemon's apply calls (kubectl runs, or rounds of creates) and their sizes
            **({"apply_calls": int(runs), "manifests_per_apply": round(manifests / runs, 1)} if runs else {}),
        }

    async def applies(self) -> tuple[float, float]:
        """The daemon's apply calls so far and the manifests they carried ((0, 0): no daemon)."""
        if self.daemon is None:
            return 0.0, 0.0
        text = await asyncio.to_thread(self.daemon.metrics)
        found = {
            sample.name: sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name.startswith("nymph_apply_batch_size_")
        }
        return found.get("nymph_apply_batch_size_count", 0.0), found.get("nymph_apply_batch_size_sum", 0.0)

    async def latency(self, n: int) -> dict[str, Any]:
        """One launch at a time: POST returned -> Pod ADDED (and POST sent -> ADDED)."""
        assert self.queue is not None
        returned: list[float] = []
        sent: list[float] = []
        api = await make_api(self.kube)
        try:
            async with AddedWatch(api, self.namespace) as watcher, self.queue.client() as c:
                for _ in range(n):
                    t = time.monotonic()
                    acc = await c.launch(
                        provider="local", mode="py", script="print(1)\n", tags={RUN_LABEL: self.run}
                    )
                    back = time.monotonic()
                    seen = await watcher.wait_for({str(acc["instanceId"])}, timeout=60)
                    returned.append(max(0.0, seen - back) * 1000)
                    sent.append((seen - t) * 1000)
                    await asyncio.sleep(0.05)
        finally:
            await api.close()
        return {
            "post_returned_to_added": latency_summary(returned),
            "post_sent_to_added": latency_summary(sent),
        }

    def daemon_memory(self) -> dict[str, int]:
        return procstat.memory_kb(self.pids["daemon"]) if "daemon" in self.pids else {}


def namespace_of(config: str) -> str:
    """The namespace a configuration's launches run in."""
    return f"bench-{config.replace('_', '-')}"


async def run_config(
    kube: LocalCluster,
    tmp: Path,
    config: Config,
    *,
    sizes: list[int],
    latency_n: int,
    posters: int,
    run: str,
    reap_after: float,
    settle_seconds: float,
) -> dict[str, Any]:
    out: dict[str, Any] = {"daemon_flags": list(config.daemon_flags or ()), "throughput": {}}
    async with Stack(
        kube, tmp, config, run=run, reap_after=reap_after, settle_seconds=settle_seconds
    ) as stack:
        for n in sizes:
            out["throughput"][str(n)] = await stack.throughput(n, posters=posters)
            print(
                f"  {config.name:<16} n={n:<5} {out['throughput'][str(n)]['per_s']:>8} launches/s", flush=True
            )
        if latency_n:
            out["latency"] = await stack.latency(latency_n)
        mem = stack.daemon_memory()
        if mem:
            out["daemon_rss_mb_after"] = round(mem.get("VmRSS", 0) / 1024, 1)
            out["daemon_peak_rss_mb"] = round(mem.get("VmHWM", 0) / 1024, 1)
    return out
