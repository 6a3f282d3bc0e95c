"""How the API server's CPU per Pod create depends on how fast the creates come.

``cpu_per_launch_vs_apiserver`` divides nymph's CPU per launch by the API server's CPU per create
in the raw burst (``raw.concurrent.cpu_ms_per_launch.kube-apiserver``): its CPU from the first
create to the last ADDED, over the Pods created. That window also holds the work that follows
each create inside it (the scheduler's binding, kwok's status updates, the watches), and how
much of it falls inside depends on how long the window is, so on the pace of the creates. This
benchmark measures it: on a control plane of its own (kube-apiserver, etcd, a kwok node), the
same raw burst as ``daemon_bench.py``, then ``n`` creates paced at each of ``rates`` Pods/s,
each with the API server's CPU per create until the last ADDED, the cores it used meanwhile and
its CPU per Pod over the Pods' whole lives. Written under ``raw_paced`` in the results
document (its other keys are kept)::

    .venv/bin/python benchmarks/raw_paced.py [--rates 50,100,200,400] [--n 1000] [--out bench-results.json]
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
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.scoreboard.kube import make_namespace, raw_create  # noqa: E402
from nymph.localcluster import LocalCluster  # noqa: E402
from tests.support.harness import NODE  # noqa: E402

SERVER = "kube-apiserver"


def row(res: dict[str, Any]) -> dict[str, Any]:
    """The figures of one run that this benchmark reports."""
    return {
        "per_s": res["per_s"],
        "apiserver_cpu_ms_per_create": res["cpu_ms_per_launch"].get(SERVER),
        "apiserver_cores": res["cores"].get(SERVER),
        "apiserver_cpu_ms_per_pod_life": res["cpu_ms_per_pod_life"].get(SERVER),
    }


async def measure(
    kube: LocalCluster,
    *,
    n: int,
    rates: list[float],
    concurrency: int,
    settle_seconds: float,
    namespace: str = "bench-paced",
    run: str = "2s",
) -> dict[str, Any]:
    """The burst, then each pace in turn, in a new ``namespace`` of ``kube`` (whose node must
    admit ``n`` Pods per run more than it holds: raw Pods are never deleted)."""
    ns = make_namespace(kube, namespace)

    async def create(start: int, rate: float | None) -> dict[str, Any]:
        res = await raw_create(
            kube,
            namespace=ns,
            n=n,
            concurrency=concurrency,
            node=NODE,
            run=run,
            start=start,
            settle_seconds=settle_seconds,
            rate=rate,
        )
        return row(res)

    burst = await create(0, None)
    paced = {f"{rate:g}": await create(k * n, rate) for k, rate in enumerate(rates, start=1)}
    return {"launches": n, "concurrency": concurrency, "burst": burst, "paced": paced}


async def measure_alone(
    *, n: int, rates: list[float], concurrency: int, settle_seconds: float
) -> dict[str, Any]:
    """:func:`measure` on a control plane of its own, gone at the end."""
    with (
        tempfile.TemporaryDirectory(prefix="nymph-paced-") as tmp,
        LocalCluster(Path(tmp) / "cluster", node="kwok", kwok_max_pods=n * (len(rates) + 2)) as kube,
    ):
        return await measure(kube, n=n, rates=rates, concurrency=concurrency, settle_seconds=settle_seconds)


def table(doc: dict[str, Any]) -> str:
    lines = [f"{'creates':<12} {'got/s':>8} {'ms/create':>10} {'cores':>6} {'ms/life':>8}"]
    runs = [("burst", doc["burst"]), *((f"{k}/s", v) for k, v in doc["paced"].items())]
    for name, r in runs:
        lines.append(
            f"{name:<12} {r['per_s']:>8} {r['apiserver_cpu_ms_per_create']:>10} "
            f"{r['apiserver_cores']:>6} {r['apiserver_cpu_ms_per_pod_life']:>8}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="the API server's CPU per Pod create, in a burst and at set paces",
        epilog="The figures go under raw_paced in --out; the file's other keys are kept.",
    )
    parser.add_argument("--rates", default="50,100,200,400", help="paces in creates/s, comma-separated")
    parser.add_argument("--n", type=int, default=1000, help="Pods per run (default 1000)")
    parser.add_argument("--concurrency", type=int, default=8, help="create workers (as daemon_bench.py)")
    parser.add_argument(
        "--settle-seconds", type=float, default=30.0, help="the most to wait for quiet after a run"
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench-results.json")
    args = parser.parse_args(argv)
    try:
        rates = [float(x) for x in args.rates.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--rates takes numbers separated by commas, not {args.rates!r}")
    if not rates or min(rates) <= 0 or args.n < 1:
        parser.error("--rates must name at least one pace above 0, and --n must be at least 1")
    started = time.time()
    doc = asyncio.run(
        measure_alone(n=args.n, rates=rates, concurrency=args.concurrency, settle_seconds=args.settle_seconds)
    )
    doc["when"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))
    print(table(doc))
    kept = json.loads(args.out.read_text()) if args.out.exists() else {}
    args.out.write_text(json.dumps({**kept, "raw_paced": doc}, indent=2) + "\n")
    print(f"written to {args.out} (under raw_paced)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
