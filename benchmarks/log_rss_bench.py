"""Daemon memory while a job prints as fast as it can: the log follower must stay bounded.

Starts the local control plane with a real node (containerd + kubelet: the container really
prints), the queue service and a daemon, runs a small warm-up job (so every code path of the
follower is loaded), measures the daemon's idle RSS, then launches a job that writes ``--mb``
MiB (200 by default) of 1 KiB lines to stdout without pausing, sampling the daemon's RSS every
0.2 s until the queue has the whole log (``complete``). The target: the peak stays within 20 MB
of the idle figure.

    python benchmarks/log_rss_bench.py [--mb 200]   # prints figures, writes bench-results/log_rss.json
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

from nymph.localcluster import LocalCluster  # noqa: E402
from tests.support.harness import DaemonProc, QueueProc, launch, setup_provider  # noqa: E402

PRINTER = """
import sys
line = b"x" * 1023 + b"\\n"
write = sys.stdout.buffer.write
for _ in range({lines}):
    write(line)
sys.stdout.flush()
"""


def rss_mb(pid: int) -> float:
    for row in Path(f"/proc/{pid}/status").read_text().splitlines():
        if row.startswith("VmRSS:"):
            return int(row.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


async def _log_done(q: QueueProc, iid: str) -> dict[str, str]:
    async with q.client() as c:
        path = c.logs_path(provider="local", instance_id=iid)
        async with c.stream(
            path, params={"follow": "false", "since": "0"}, headers={"Accept": "text/plain"}
        ) as r:
            await r.read()
            return {k: v for k, v in r.headers.items() if k.startswith("X-Nymph-Log")}


async def run_job(q: QueueProc, pid: int, *, lines: int, timeout: float) -> dict[str, Any]:
    iid = await launch(q, script=PRINTER.format(lines=lines))
    t0 = time.monotonic()
    peak, samples = 0.0, 0
    headers: dict[str, str] = {}
    while time.monotonic() - t0 < timeout:
        peak = max(peak, rss_mb(pid))
        samples += 1
        if samples % 5 == 0:
            headers = await _log_done(q, iid)
            if headers.get("X-Nymph-Log-Complete") == "true":
                break
        await asyncio.sleep(0.2)
    return {
        "instance": iid,
        "seconds": round(time.monotonic() - t0, 1),
        "peak_rss_mb": round(peak, 1),
        "complete": headers.get("X-Nymph-Log-Complete") == "true",
        "log_size": int(headers.get("X-Nymph-Log-Next-Offset", "0") or 0),
        "log_dropped": headers.get("X-Nymph-Log-Dropped", ""),
    }


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=200, help="MiB the job prints (default 200)")
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="nymph-log-bench-"))
    with LocalCluster(tmp / "cluster", node="real", node_names=()) as kube:
        image = next(i for i in kube.node_image_names if "/python:" in i)
        q = QueueProc(tmp / "queue.db")
        q.tokens()
        q.start()
        assert kube.real_node is not None
        d = DaemonProc(
            q, kube.kubeconfig, "default", tmp / "root", extra=("--reap-after", "5"), node=kube.real_node
        )
        try:
            await setup_provider(q, "default", image=image)
            d.start()
            assert d.proc is not None
            pid = d.proc.pid
            warm = await run_job(q, pid, lines=2048, timeout=300)
            idle = 0.0
            for _ in range(15):  # settled after the warm-up: the highest of 3 s of samples
                await asyncio.sleep(0.2)
                idle = max(idle, rss_mb(pid))
            big = await run_job(q, pid, lines=args.mb * 1024, timeout=args.timeout)
        finally:
            d.kill()
            q.kill()
    result = {
        "printed_mb": args.mb,
        "idle_rss_mb": round(idle, 1),
        "peak_rss_mb": big["peak_rss_mb"],
        "delta_mb": round(big["peak_rss_mb"] - idle, 1),
        "target_delta_mb": 20,
        "warm_up": warm,
        "job": big,
    }
    out = REPO / "bench-results"
    out.mkdir(exist_ok=True)
    (out / "log_rss.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0 if result["delta_mb"] <= 20 and big["complete"] else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
