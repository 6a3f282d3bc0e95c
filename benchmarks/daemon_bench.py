"""Daemon benchmark: queue-to-Pod-created latency and launches per second.

Starts the local control plane, the queue service and a daemon (each configuration in turn),
submits N launches at once and watches the API server for their Pods. Latency is measured
from the moment the launch POST returned to the moment the Pod's ADDED event arrived. The
baseline is N Pods created directly with the API (no queue, no daemon), in the same run, so
the ratio is meaningful on a noisy machine.

    python benchmarks/daemon_bench.py [-n 60]    # prints figures, writes bench-results/daemon.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kubernetes_asyncio import client, watch  # noqa: E402

from nymph.kube.api import make_api_client  # noqa: E402
from nymph.localcluster import LocalCluster  # noqa: E402
from tests.e2e.harness import DaemonProc, QueueProc, setup_provider  # noqa: E402


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))
    return s[k]


async def watch_added(
    api: client.ApiClient, namespace: str, want: int, seen: dict[str, float], ready: asyncio.Event
) -> None:
    v1 = client.CoreV1Api(api)
    w = watch.Watch()
    first = True
    async with w:
        async for ev in w.stream(v1.list_namespaced_pod, namespace=namespace, timeout_seconds=300):
            if first:
                ready.set()
                first = False
            name = ev["raw_object"]["metadata"]["name"]
            if ev["type"] == "ADDED" and name not in seen:
                seen[name] = time.monotonic()
            if len(seen) >= want:
                return


async def start_watch(
    api: client.ApiClient, namespace: str, n: int, seen: dict[str, float]
) -> asyncio.Task[None]:
    ready = asyncio.Event()
    task = asyncio.create_task(watch_added(api, namespace, n, seen, ready))
    # The watch starts with ADDED events for existing Pods (none); give it a moment to connect.
    await asyncio.sleep(0.5)
    return task


async def run_daemon_case(
    kube: LocalCluster, tmp: Path, name: str, n: int, extra: tuple[str, ...]
) -> dict[str, Any]:
    ns = f"bench-{name}"
    kube.api("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    kube.wait_default_sa(ns)
    q = QueueProc(tmp / f"{name}.db")
    q.tokens()
    q.start()
    d = DaemonProc(q, kube.kubeconfig, ns, tmp / f"root-{name}", extra=("--reap-after", "3600", *extra))
    try:
        await setup_provider(q, ns)
        d.start()
        await asyncio.sleep(1.0)
        api = await make_api_client(kubeconfig=str(kube.kubeconfig))
        seen: dict[str, float] = {}
        task = await start_watch(api, ns, n, seen)
        posted: dict[str, float] = {}
        t0 = time.monotonic()
        async with q.client() as c:
            for _ in range(n):
                acc = await c.launch(
                    provider="local", mode="py", script="print(1)\n", tags={"sim.nymph.io/run": "1h"}
                )
                posted[str(acc["instanceId"])] = time.monotonic()
        await asyncio.wait_for(task, 300)
        t_end = max(seen.values())
        await api.close()
        lat = [(seen[i] - posted[i]) * 1000 for i in posted]
        return {
            "case": name,
            "launches": n,
            "p50_ms": round(pct(lat, 50), 1),
            "p95_ms": round(pct(lat, 95), 1),
            "launches_per_s": round(n / (t_end - t0), 2),
            "daemon_flags": list(extra),
        }
    finally:
        d.kill()
        q.kill()


async def run_raw(kube: LocalCluster, n: int) -> dict[str, Any]:
    ns = "bench-raw"
    kube.api("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    kube.wait_default_sa(ns)
    api = await make_api_client(kubeconfig=str(kube.kubeconfig))
    v1 = client.CoreV1Api(api)
    lat: list[float] = []
    t0 = time.monotonic()
    for i in range(n):
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"raw-{i}", "labels": {"sim.nymph.io/run": "1h"}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "user", "image": "python:3.12-slim"}]},
        }
        s = time.monotonic()
        await v1.create_namespaced_pod(ns, body)
        lat.append((time.monotonic() - s) * 1000)
    total = time.monotonic() - t0
    await api.close()
    return {
        "case": "raw-api-create",
        "launches": n,
        "p50_ms": round(pct(lat, 50), 1),
        "p95_ms": round(pct(lat, 95), 1),
        "launches_per_s": round(n / total, 2),
    }


async def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-n", type=int, default=60, help="launches per case (default 60)")
    parser.add_argument("--out", default=str(REPO / "bench-results" / "daemon.json"))
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="nymph-bench-"))
    results: list[dict[str, Any]] = []
    with LocalCluster(tmp / "cluster") as kube:
        print(f"control plane up in {kube.start_seconds:.1f}s", flush=True)
        results.append(await run_raw(kube, args.n))
        cases = [
            ("kubectl-batched", ("--concurrency", "16", "--batch-max", "16")),
            ("kubectl-unbatched", ("--concurrency", "16", "--batch-max", "1")),
            ("api", ("--concurrency", "16", "--apply-with", "api")),
        ]
        for name, extra in cases:
            print(f"running {name} ...", flush=True)
            results.append(await run_daemon_case(kube, tmp, name, args.n, extra))
    raw = results[0]["launches_per_s"]
    print(f"\n{'case':<20} {'n':>4} {'p50 ms':>9} {'p95 ms':>9} {'launch/s':>9} {'vs raw':>7}")
    for r in results:
        r["ratio_vs_raw"] = round(r["launches_per_s"] / raw, 3) if raw else None
        print(
            f"{r['case']:<20} {r['launches']:>4} {r['p50_ms']:>9} {r['p95_ms']:>9} {r['launches_per_s']:>9} {r['ratio_vs_raw']:>7}"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "results": results}, indent=2)
    )
    print(f"\nwritten to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
