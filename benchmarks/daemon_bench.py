"""The benchmark scoreboard: nymph against the raw limit of the API server, in one run.

Starts the local control plane (kube-apiserver, etcd, kwok) and measures, in this order so the
same machine state serves every figure:

1. raw: Pods created by a tight kubernetes_asyncio client, with the daemon's concurrency and
   serially (creates/s, create latency), and one at a time (create -> ADDED);
2. nymph end to end for direct dispatch and, on the daemon path, kubectl batched, kubectl one
   per invocation and api mode: N launches posted as fast as the queue takes them, launches/s
   from the first POST to the last Pod ADDED, and the CPU each process spent per launch
   (queue, daemon, its kubectl children, kube-apiserver, etcd, kwok) from /proc. After raw and
   after each path its namespace is deleted and its Pods gone (``namespace_dropped_s``), so
   every path runs on the cluster raw found, not among the thousands of finished Pods the runs
   before it left;
3. latency at low load: one launch at a time, POST returned -> Pod ADDED;
4. one kubectl invocation as the deployed daemon runs it (read-only root: no cache);
5. the idle daemon: RSS, CPU and queue requests per minute; with --soak, RSS over many launches;
6. the queue alone: claims/s, POST latency and CPU with 1, 10 and 100 long-polling daemons.

Writes JSON (every ratio under a key ending in ``_ratio``; the other benchmarks' sections of
the file are kept) and prints the same as a table.

    python benchmarks/daemon_bench.py                 # the full run, bench-results.json
    python benchmarks/daemon_bench.py --soak 10000    # and the 10,000-launch soak
    python benchmarks/daemon_bench.py --smoke         # tiny N, no targets (the test suite runs it)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import sigterm  # noqa: E402
from benchmarks.scoreboard import footprint, page, procstat, queue_load, report  # noqa: E402
from benchmarks.scoreboard.kube import (  # noqa: E402
    drop_namespace,
    make_namespace,
    raw_create,
    raw_latency,
    server_version,
)
from benchmarks.scoreboard.nymph_run import configs, namespace_of, run_config  # noqa: E402
from nymph.kube.binaries import kubectl_path  # noqa: E402
from nymph.localcluster import LocalCluster  # noqa: E402
from tests.support.harness import NODE  # noqa: E402

#: Pods the kwok node admits at once. A kubelet's default (110) would make the benchmark measure
#: the node's Pod slots: 2 s jobs arriving at 60/s keep 120 running, the rest turn Unschedulable
#: and the queue moves them. Raw creates never wait for a slot.
MAX_PODS = 5000


@dataclass(frozen=True)
class Params:
    sizes: tuple[int, ...] = (1, 100, 1000)
    latency_n: int = 50
    concurrency: int = 8
    run: str = "2s"
    reap_after: float = 600.0
    settle_seconds: float = 30.0
    kubectl_n: int = 10
    idle_warmup: float = 20.0
    idle_seconds: float = 300.0
    queue_daemons: tuple[int, ...] = (1, 10, 100)
    queue_launches: int = 200
    queue_paced_seconds: float = 20.0
    soak: int = 0
    targets: bool = True
    only: tuple[str, ...] = ()


SMOKE = Params(
    sizes=(1, 3),
    run="1s",
    latency_n=2,
    kubectl_n=1,
    idle_warmup=1.0,
    idle_seconds=2.0,
    queue_daemons=(1, 3),
    queue_launches=3,
    queue_paced_seconds=0.0,
    settle_seconds=1.0,
    targets=False,
)


async def run(kube: LocalCluster, tmp: Path, p: Params) -> dict[str, Any]:
    """Every measurement against ``kube``; the result document (without writing it)."""
    started = time.time()

    def say(what: str) -> None:
        print(f"[{time.time() - started:6.1f}s] {what}", flush=True)

    results: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "machine": procstat.machine(apiserver=server_version(kube), kubectl=kubectl_path()),
        "params": {k: list(v) if isinstance(v, tuple) else v for k, v in vars(p).items()},
    }
    top = max(p.sizes)
    say("raw")
    ns = make_namespace(kube, "bench-raw")
    results["raw"] = {
        "concurrent": await raw_create(
            kube,
            namespace=ns,
            n=top,
            concurrency=p.concurrency,
            node=NODE,
            run=p.run,
            settle_seconds=p.settle_seconds,
        ),
        "serial": await raw_create(
            kube,
            namespace=ns,
            n=top,
            concurrency=1,
            node=NODE,
            run=p.run,
            start=top,
            settle_seconds=p.settle_seconds,
        ),
        "latency": await raw_latency(kube, namespace=ns, n=p.latency_n, node=NODE, run=p.run),
    }
    # every path starts on the cluster the raw run found: no Pods of the runs before it
    results["namespace_dropped_s"] = {"raw": round(await drop_namespace(kube, ns), 1)}
    results["nymph"] = {}
    for config in configs(concurrency=p.concurrency):
        if p.only and config.name not in p.only:
            continue
        say(config.name)
        results["nymph"][config.name] = await run_config(
            kube,
            tmp,
            config,
            sizes=list(p.sizes),
            latency_n=p.latency_n,
            posters=p.concurrency,
            run=p.run,
            reap_after=p.reap_after,
            settle_seconds=p.settle_seconds,
        )
        dropped = await drop_namespace(kube, namespace_of(config.name))
        results["namespace_dropped_s"][config.name] = round(dropped, 1)
        say(f"  its namespace and Pods deleted in {dropped:.1f} s")
    say("kubectl invocations")
    results["kubectl_invocation"] = await asyncio.to_thread(
        footprint.kubectl_invocations, kube, tmp, n=p.kubectl_n
    )
    say("idle daemon")
    results["idle_daemon"] = await footprint.idle(kube, tmp, warmup=p.idle_warmup, seconds=p.idle_seconds)
    results["soak"] = None
    if p.soak:
        say(f"soak ({p.soak} launches)")
        results["soak"] = await footprint.soak(
            kube, tmp, launches=p.soak, step=max(1, p.soak // 10), run="1s"
        )
    say("queue")
    results["queue"] = await queue_load.run(
        tmp,
        daemon_counts=list(p.queue_daemons),
        launches=p.queue_launches,
        paced_seconds=p.queue_paced_seconds,
    )
    results.update(report.ratios(results))
    results["lifecycle_limit_per_s"] = report.lifecycle_limit(results)
    results["cpu_per_launch_vs_apiserver"] = report.cpu_vs_apiserver(results)
    results["cpu_per_launch_vs_apiserver_in_run"] = report.cpu_vs_apiserver_in_run(results)
    results["targets"] = report.targets(results) if p.targets else None
    results["machine"]["load_average_end"] = procstat.machine()["load_average"]
    results["seconds"] = round(time.time() - started, 1)
    return results


def parse(argv: list[str] | None = None) -> tuple[Params, Path]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="tiny N, short idle, no targets")
    parser.add_argument("--sizes", help="launch counts, comma-separated (default 1,100,1000)")
    parser.add_argument("--latency-n", type=int, help="launches one at a time (default 50)")
    parser.add_argument("--idle-seconds", type=float, help="idle daemon window (default 300)")
    parser.add_argument(
        "--soak", type=int, default=0, help="launches through one daemon for the RSS soak (e.g. 10000)"
    )
    parser.add_argument("--only", help="configurations to run, comma-separated (default all)")
    parser.add_argument("--out", type=Path, default=REPO / "bench-results.json")
    parser.add_argument("--markdown", type=Path, help="print docs/performance.md for a results file and exit")
    args = parser.parse_args(argv)
    if args.markdown:
        print(page.page(json.loads(args.markdown.read_text())), end="")
        raise SystemExit(0)
    p = SMOKE if args.smoke else Params()
    changes: dict[str, Any] = {"soak": args.soak}
    if args.sizes:
        changes["sizes"] = tuple(int(x) for x in args.sizes.split(","))
    if args.latency_n is not None:
        changes["latency_n"] = args.latency_n
    if args.idle_seconds is not None:
        changes["idle_seconds"] = args.idle_seconds
    if args.only:
        changes["only"] = tuple(args.only.split(","))
    return Params(**{**vars(p), **changes}), args.out


async def main(argv: list[str] | None = None) -> int:
    params, out = parse(argv)
    with tempfile.TemporaryDirectory(prefix="nymph-bench-") as tmpdir:
        tmp = Path(tmpdir)
        with LocalCluster(tmp / "cluster", node="kwok", kwok_max_pods=MAX_PODS) as kube:
            print(f"control plane up in {kube.start_seconds:.1f}s", flush=True)
            results = await run(kube, tmp, params)
    # the other benchmarks' sections (scheduling, groups, PostgreSQL, ...) are kept as they are
    kept = json.loads(out.read_text()) if out.exists() else {}
    out.write_text(json.dumps({**kept, **results}, indent=2) + "\n")
    print()
    print(report.table(results))
    print(f"\nwritten to {out}")
    return 0


if __name__ == "__main__":
    sigterm.unwind_on_sigterm()
    sys.exit(asyncio.run(main()))
