"""What one daemon asks of the queue per launch: N launches through the api configuration of
``daemon_bench.py`` (a daemon applying with the API client, concurrency 8), the daemon talking
to the queue through a proxy that counts its requests by route; prints (and writes, with
``--out``) the dispatch requests per route and the CPU the queue and the daemon spent per launch.

    python benchmarks/dispatch_requests.py --launches 1000
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

from benchmarks.daemon_bench import MAX_PODS  # noqa: E402
from benchmarks.scoreboard import procstat  # noqa: E402
from benchmarks.scoreboard.footprint import CountingProxy, _Proxied  # noqa: E402
from benchmarks.scoreboard.kube import RUN_LABEL, AddedWatch, make_api, make_namespace, new_queue  # noqa: E402
from benchmarks.scoreboard.nymph_run import DEPLOYED_ENV, configs  # noqa: E402
from nymph.localcluster import LocalCluster  # noqa: E402
from tests.support.harness import DaemonProc  # noqa: E402


async def measure(kube: LocalCluster, tmp: Path, *, launches: int, posters: int = 8) -> dict[str, Any]:
    api = next(c for c in configs(concurrency=posters) if c.name == "api")
    assert api.daemon_flags is not None
    ns = make_namespace(kube, "bench-requests")
    q = new_queue(tmp / "queue.db")
    d: DaemonProc | None = None
    try:
        async with q.client() as c:
            await c.create_provider(name="local", kwargs={"namespace": ns}, dispatch="daemon")
            await c.create_mode(name="py", provider="local", fields={"image": "python:3.12-slim"})
        async with CountingProxy(q.url) as proxy:
            d = DaemonProc(
                _Proxied(proxy.url, q.daemon_token),  # type: ignore[arg-type]
                kube.kubeconfig,
                ns,
                tmp / "root",
                extra=("--reap-after", "600", "--poll-wait", "30", *api.daemon_flags),
                env=dict(DEPLOYED_ENV),
            )
            d.start()
            assert d.proc is not None and q.proc is not None
            pids = {"queue": q.proc.pid, "daemon": d.proc.pid}
            await asyncio.sleep(1.0)
            proxy.counts.clear()
            client = await make_api(kube)
            try:
                async with AddedWatch(client, ns) as watch:
                    before = procstat.snapshot(pids)
                    posted: set[str] = set()
                    left = [launches]

                    async def poster() -> None:
                        async with q.client() as c:
                            while left[0] > 0:
                                left[0] -= 1
                                acc = await c.launch(
                                    provider="local", mode="py", script="print(1)\n", tags={RUN_LABEL: "2s"}
                                )
                                posted.add(str(acc["instanceId"]))

                    await asyncio.gather(*(poster() for _ in range(posters)))
                    await watch.wait_for(posted)
                    await _settle(pids)
                    spent = procstat.cpu_delta(before, procstat.snapshot(pids))
            finally:
                await client.close()
            counts = {k: v for k, v in sorted(proxy.counts.items()) if k.startswith("/v1/dispatch/")}
    finally:
        if d is not None:
            d.kill()
        q.kill()
    return {
        "launches": launches,
        "requests": counts,
        "cpu_ms_per_launch": {k: round(v * 1000 / launches, 2) for k, v in spent.items()},
    }


async def _settle(pids: dict[str, int], *, seconds: float = 30.0, quiet_cpu: float = 0.05) -> None:
    """Wait until the queue and the daemon are idle (trailing reports and completions sent)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        before = procstat.snapshot(pids)
        await asyncio.sleep(1.0)
        if sum(procstat.cpu_delta(before, procstat.snapshot(pids)).values()) < quiet_cpu:
            return


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--launches", type=int, default=1000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="nymph-requests-") as tmpdir:
        tmp = Path(tmpdir)
        with LocalCluster(tmp / "cluster", node="kwok", kwok_max_pods=MAX_PODS) as kube:
            result = await measure(kube, tmp, launches=args.launches)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
