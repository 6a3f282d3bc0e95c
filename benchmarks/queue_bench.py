"""Benchmark the queue service: claim throughput and long-poll wake-up latency.

Starts ``nymph queue serve`` as a subprocess on a free 127.0.0.1 port with a fresh SQLite
file, and again on a fresh PostgreSQL database (a server started like the tests start it, from
Debian's ``postgresql``; skipped with a note when its binaries are missing), then, from this
process, for each:

* launch throughput and POST latency: N launches POSTed by 10 concurrent clients (each is a
  durable commit);
* claim throughput: D concurrent daemons drain those N tasks (capacity C per claim, and again
  with capacity 1), in tasks/s;
* wake-up latency: D daemons hold claim long-polls; a launch is POSTed and the time until a
  daemon's claim returns with it is measured, S times (p50/p95 in ms).

Prints the figures and writes them to ``bench-results/queue.json``.

    .venv/bin/python benchmarks/queue_bench.py [--tasks 2000] [--daemons 20] [--capacity 10]
        [--backend sqlite|postgresql|both]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from nymph.client import QueueClient

ROOT = Path(__file__).resolve().parent.parent


def nymph(*args: str) -> list[str]:
    return [sys.executable, "-m", "nymph.cli", "--log-level", "warning", *args]


def token(db: Path | str, role: str) -> str:
    out = subprocess.run(
        nymph("queue", "token", "create", "--db", str(db), "--role", role),
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.split()[-1]


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * p
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


async def launch_all(
    url: str, user_token: str, n: int, *, start: int = 0, latencies: list[float] | None = None
) -> float:
    async def worker(k: int) -> None:
        async with QueueClient(base_url=url, token=user_token) as user:
            for i in range(start + k, start + n, 10):
                t0 = time.perf_counter()
                await user.launch(provider="bench", mode="tiny", script=f"print({i})")
                if latencies is not None:
                    latencies.append((time.perf_counter() - t0) * 1000)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(10)))
    return time.perf_counter() - t0


async def drain(url: str, daemon_token: str, n: int, *, daemons: int, capacity: int) -> float:
    claimed = 0
    done = asyncio.Event()

    async def daemon(d: int) -> None:
        nonlocal claimed
        async with QueueClient(base_url=url, token=daemon_token) as client:
            while not done.is_set():
                tasks = await client.claim(
                    daemon_id=f"bench-{d}", node=f"n{d}", capacity=capacity, wait=0.5, lease_seconds=600
                )
                claimed += len(tasks)
                if claimed >= n:
                    done.set()

    t0 = time.perf_counter()
    await asyncio.gather(*(daemon(d) for d in range(daemons)))
    return time.perf_counter() - t0


async def wake_latency(
    url: str, user_token: str, daemon_token: str, *, daemons: int, samples: int
) -> list[float]:
    arrivals: dict[str, float] = {}
    arrived = asyncio.Condition()
    stop = asyncio.Event()

    async def daemon(d: int) -> None:
        async with QueueClient(base_url=url, token=daemon_token) as client:
            while not stop.is_set():
                tasks = await client.claim(daemon_id=f"wake-{d}", node=f"n{d}", capacity=1, wait=5)
                now = time.perf_counter()
                if tasks:
                    async with arrived:
                        for t in tasks:
                            arrivals[str(t["instanceId"])] = now
                        arrived.notify_all()

    pollers = [asyncio.create_task(daemon(d)) for d in range(daemons)]
    latencies: list[float] = []
    async with QueueClient(base_url=url, token=user_token) as user:
        await asyncio.sleep(1.0)  # every daemon is holding a long-poll
        for i in range(samples):
            t0 = time.perf_counter()
            iid = (await user.launch(provider="bench", mode="tiny", script=f"print('wake {i}')"))[
                "instanceId"
            ]
            async with arrived:
                await arrived.wait_for(lambda iid=iid: iid in arrivals)
            latencies.append((arrivals[iid] - t0) * 1000)
            await asyncio.sleep(0.05)  # let the daemon re-arm its long-poll
    stop.set()
    await asyncio.gather(*pollers)
    return latencies


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "params": vars(args),
    }
    if args.backend in ("sqlite", "both"):
        with tempfile.TemporaryDirectory(prefix="nymph-bench-") as tmp:
            out.update(await bench_one(args, Path(tmp) / "queue.db"))
    if args.backend in ("postgresql", "both"):
        sys.path.insert(0, str(ROOT))
        from tests.support.pg_server import PgUnavailable, running_server

        try:
            with running_server() as server:
                out["postgresql"] = await bench_one(args, server.fresh_database(migrated=False))
        except PgUnavailable as exc:
            out["postgresql"] = {"skipped": str(exc)}
    return out


async def bench_one(args: argparse.Namespace, db: Path | str) -> dict[str, Any]:
    user_token, daemon_token = token(db, "user"), token(db, "daemon")
    proc = await asyncio.to_thread(
        subprocess.Popen,
        nymph("queue", "serve", "--db", str(db), "--listen", "127.0.0.1:0"),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.to_thread(proc.stdout.readline)
        url = line.split("serving on ", 1)[1].split()[0]
        async with QueueClient(base_url=url, token=user_token) as user:
            await user.create_provider(name="bench", kwargs={"namespace": "bench"}, dispatch="daemon")
            await user.create_mode(name="tiny", provider="bench", fields={"image": "busybox"})
        n = args.tasks
        post_ms: list[float] = []
        launch_s = await launch_all(url, user_token, n, latencies=post_ms)
        drain_s = await drain(url, daemon_token, n, daemons=args.daemons, capacity=args.capacity)
        await launch_all(url, user_token, n // 4, start=n)
        drain1_s = await drain(url, daemon_token, n // 4, daemons=args.daemons, capacity=1)
        lat = await wake_latency(url, user_token, daemon_token, daemons=args.daemons, samples=args.samples)
    finally:
        proc.terminate()
        proc.wait(30)
    return {
        "launch_per_s": round(n / launch_s, 1),
        "launch_post_ms": {
            "p50": round(statistics.median(post_ms), 2),
            "p95": round(percentile(post_ms, 0.95), 2),
        },
        "claim_tasks_per_s": round(n / drain_s, 1),
        "claim_tasks_per_s_capacity_1": round((n // 4) / drain1_s, 1),
        "wake_latency_ms": {
            "p50": round(statistics.median(lat), 2),
            "p95": round(percentile(lat, 0.95), 2),
            "max": round(max(lat), 2),
            "samples": len(lat),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--daemons", type=int, default=20)
    parser.add_argument("--capacity", type=int, default=10)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "queue.json")
    args = parser.parse_args()
    result = asyncio.run(bench(args))
    for name, figures in (("sqlite", result), ("postgresql", result.get("postgresql") or {})):
        if "launch_per_s" not in figures:
            if "skipped" in figures:
                print(f"[{name}] skipped: {figures['skipped']}")
            continue
        report(name, figures, args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result["params"] = {**result["params"], "out": str(args.out)}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {args.out}")


def report(name: str, result: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"[{name}]")
    p = result["launch_post_ms"]
    print(f"launches (10 clients, durable):        {result['launch_per_s']:>9.1f} /s")
    print(f"launch POST latency (ms):              p50 {p['p50']}  p95 {p['p95']}")
    print(
        f"claim throughput ({args.daemons} daemons, cap {args.capacity}): {result['claim_tasks_per_s']:>9.1f} tasks/s"
    )
    print(
        f"claim throughput ({args.daemons} daemons, cap 1):  {result['claim_tasks_per_s_capacity_1']:>9.1f} tasks/s"
    )
    w = result["wake_latency_ms"]
    print(f"wake-up latency POST->claim (ms):      p50 {w['p50']}  p95 {w['p95']}  max {w['max']}")


if __name__ == "__main__":
    main()
