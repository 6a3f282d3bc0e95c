"""Benchmark writes on PostgreSQL one network round trip away: do writes to different launches
wait for each other, and do replicas add launches per second?

A real PostgreSQL server is started as the tests start it (:mod:`tests.support.pg_server`), and
every replica (``nymph queue serve`` subprocesses on free 127.0.0.1 ports) reaches it through a
TCP proxy on loopback that delays every byte 1 ms each way (:mod:`tests.support.latency_proxy`,
a process of its own), as a database in another machine of the zone would:

* ``pg_concurrency``: one replica. The time of one launch POST (the median of ``rounds``, one at
  a time), and of 16 POSTs of different launches sent at once (the median of ``rounds``
  bursts); ``ratio_16_to_1`` is the second over the first (target <= 2.0: with writes waiting
  for each other 16 would take about 16 times one).
* ``pg_replicas``: 1 replica, then 3 on one fresh database each time. ``workers`` loops, each a
  daemon of its own team (``teams`` namespaces, each with its own kube namespace; claims of one
  namespace take a lock of that namespace), each spread over the replicas: POST a launch,
  claim (capacity 1), complete what it got. Launches completed per second over ``seconds``
  (after a warm-up), and each replica's CPU (% of one core) meanwhile; ``ratio_3_to_1`` is 3
  replicas' rate over 1's (target >= 1.5; the replicas, PostgreSQL, the proxy and this load
  share the machine's cores).

Merges its figures into ``bench-results.json`` under ``pg_concurrency`` and ``pg_replicas`` (the
file's other keys are kept); ``daemon_bench.py --markdown`` shows them on docs/performance.md.

    .venv/bin/python benchmarks/pg_bench.py [--quick] [--out bench-results.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.scoreboard.procstat import cpu  # noqa: E402
from nymph.client import DaemonIdentity, QueueClient  # noqa: E402
from nymph.logsetup import configure_logging  # noqa: E402
from nymph.queue.auth import create_token  # noqa: E402
from nymph.queue.models import Role  # noqa: E402
from nymph.queue.pgdb import write_once  # noqa: E402
from nymph.queue.sql.dialect import Conn  # noqa: E402
from tests.support.latency_proxy import pg_url_through  # noqa: E402
from tests.support.pg_server import PgServer, running_server  # noqa: E402

BURST = 16


@dataclass(frozen=True)
class Params:
    rounds: int = 15
    seconds: float = 20.0
    warmup: float = 3.0
    workers: int = 12
    teams: int = 6
    delay_ms: float = 1.0


QUICK = Params(rounds=4, seconds=4.0, warmup=1.0, workers=6, teams=3)
_PROCS: list[subprocess.Popen[str]] = []


def tree_cpu(root: int) -> float:
    """CPU seconds of ``root`` and its live children (PostgreSQL's backends)."""
    total = cpu(root).own
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == root:
                total += cpu(int(stat.parent.name)).own
    return total


def _own_cpu() -> float:
    t = os.times()
    return t.user + t.system


def _start(cmd: list[str], *, marker: str) -> tuple[subprocess.Popen[str], str]:
    """A subprocess of this benchmark and the rest of the first stdout line after ``marker``."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True
    )
    _PROCS.append(proc)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if marker not in line:
        _stop(proc)
        raise RuntimeError(f"{cmd[2:4]} did not start: {line!r}")
    return proc, line.split(marker, 1)[1].split()[0]


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    if proc in _PROCS:
        _PROCS.remove(proc)


@contextlib.contextmanager
def proxy(server: PgServer, p: Params) -> Iterator[tuple[int, int]]:
    """The latency proxy in front of ``server``: (its port, its pid)."""
    socket = str(server.socket_dir / f".s.PGSQL.{server.port}")
    cmd = [sys.executable, "-m", "tests.support.latency_proxy", "--target-unix", socket]
    proc, port = _start([*cmd, "--delay-ms", str(p.delay_ms)], marker="listening on ")
    try:
        yield int(port), proc.pid
    finally:
        _stop(proc)


@dataclass
class Replicas:
    db: str
    user_token: str = ""
    daemon_token: str = ""
    procs: list[subprocess.Popen[str]] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)

    def cpu_seconds(self) -> list[float]:
        return [cpu(p.pid).own for p in self.procs]


@contextlib.asynccontextmanager
async def replicas(db: str, count: int) -> AsyncIterator[Replicas]:
    """``count`` replicas on ``db`` (a URL through the proxy) with a user and a daemon token."""

    def tokens(conn: Conn) -> tuple[str, str]:
        return create_token(conn, role=Role.USER).token, create_token(conn, role=Role.DAEMON).token

    r = Replicas(db=db)
    r.user_token, r.daemon_token = await asyncio.to_thread(write_once, db, tokens)
    serve = [sys.executable, "-m", "nymph.cli", "--log-level", "warning", "queue", "serve", "--db", db]
    try:
        for _ in range(count):
            proc, url = await asyncio.to_thread(
                _start, [*serve, "--listen", "127.0.0.1:0"], marker="serving on "
            )
            r.procs.append(proc)
            r.urls.append(url)
        yield r
    finally:
        for proc in r.procs:
            await asyncio.to_thread(_stop, proc)


async def _teams(r: Replicas, teams: int) -> None:
    async with QueueClient(base_url=r.urls[0], token=r.user_token, timeout=60) as user:
        for t in range(teams):
            ns = f"team-{t}"
            await user.create_provider(
                name="bench", kwargs={"namespace": f"bench-{t}"}, dispatch="daemon", namespace=ns
            )
            await user.create_mode(name="tiny", provider="bench", fields={"image": "busybox"}, namespace=ns)


async def _launch(user: QueueClient, team: int) -> str:
    got = await user.launch(provider="bench", mode="tiny", script="true", namespace=f"team-{team}")
    return str(got["instanceId"])


# --- the measurements ----------------------------------------------------------------------


async def concurrency(db: str, p: Params) -> dict[str, Any]:
    async with replicas(db, 1) as r:
        await _teams(r, 1)
        async with QueueClient(base_url=r.urls[0], token=r.user_token, timeout=60) as user:
            for _ in range(5):  # warm up (connections, caches), unmeasured
                await asyncio.gather(*(_launch(user, 0) for _ in range(BURST)))
            one: list[float] = []
            burst: list[float] = []
            for _ in range(p.rounds):
                t0 = time.perf_counter()
                await _launch(user, 0)
                one.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                await asyncio.gather(*(_launch(user, 0) for _ in range(BURST)))
                burst.append(time.perf_counter() - t0)
    one_ms, burst_ms = statistics.median(one) * 1000, statistics.median(burst) * 1000
    return {
        "one_post_ms": round(one_ms, 1),
        "burst_16_ms": round(burst_ms, 1),
        "ratio_16_to_1": round(burst_ms / one_ms, 2),
        "rounds": p.rounds,
        "target": "<= 2.0",
    }


async def throughput(db: str, count: int, p: Params, proxy_pid: int, pg_pid: int) -> dict[str, Any]:
    """Launches POSTed, claimed and completed per second by ``p.workers`` loops over ``count``
    replicas, and each replica's CPU meanwhile."""
    async with replicas(db, count) as r:
        await _teams(r, p.teams)
        done = 0
        measuring = asyncio.Event()
        stop = asyncio.Event()

        async def worker(k: int) -> None:
            nonlocal done
            team, url = k % p.teams, r.urls[k % count]
            identity = DaemonIdentity(daemon_id=f"d{k}", node=f"n{k}", namespaces=(f"bench-{team}",))
            async with (
                QueueClient(base_url=url, token=r.user_token, timeout=60) as user,
                QueueClient(base_url=url, token=r.daemon_token, timeout=60, daemon=identity) as d,
            ):
                while not stop.is_set():
                    await _launch(user, team)
                    tasks = await d.claim(
                        daemon_id=f"d{k}", node=f"n{k}", namespaces=[f"bench-{team}"], capacity=1, wait=0
                    )
                    for t in tasks:
                        await d.complete(daemon_id=f"d{k}", task_id=t["taskId"], ok=True)
                        if measuring.is_set() and not stop.is_set():
                            done += 1

        workers = [asyncio.create_task(worker(k), name=f"bench-worker-{k}") for k in range(p.workers)]
        try:
            await asyncio.sleep(p.warmup)
            before, proxy_before, t0 = r.cpu_seconds(), cpu(proxy_pid).own, time.perf_counter()
            pg_before, load_before = tree_cpu(pg_pid), _own_cpu()
            measuring.set()
            await asyncio.sleep(p.seconds)
            stop.set()
            elapsed = time.perf_counter() - t0
            after, proxy_after = r.cpu_seconds(), cpu(proxy_pid).own
            pg_after, load_after = tree_cpu(pg_pid), _own_cpu()
            counted = done
        finally:
            stop.set()
            await asyncio.gather(*workers, return_exceptions=True)
    return {
        "launches_per_s": round(counted / elapsed, 1),
        "launches": counted,
        "seconds": round(elapsed, 1),
        "replica_cpu_pct": [round(100 * (a - b) / elapsed, 1) for a, b in zip(after, before, strict=True)],
        "proxy_cpu_pct": round(100 * (proxy_after - proxy_before) / elapsed, 1),
        "postgres_cpu_pct": round(100 * (pg_after - pg_before) / elapsed, 1),
        "load_cpu_pct": round(100 * (load_after - load_before) / elapsed, 1),
        "machine_load_1m": round(os.getloadavg()[0], 1),
    }


async def run(p: Params, say: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with running_server() as server, proxy(server, p) as (port, proxy_pid):
        say("pg_concurrency")
        out["pg_concurrency"] = await concurrency(pg_url_through(server.fresh_database(), port), p)
        say(f"  {out['pg_concurrency']}")
        rows: dict[str, Any] = {}
        for count in (1, 3):
            say(f"pg_replicas: {count}")
            db = pg_url_through(server.fresh_database(), port)
            assert server.proc is not None
            rows[str(count)] = await throughput(db, count, p, proxy_pid, server.proc.pid)
            say(f"  {rows[str(count)]}")
        out["pg_replicas"] = {
            "ratio_3_to_1": round(rows["3"]["launches_per_s"] / max(rows["1"]["launches_per_s"], 1e-9), 2),
            "replicas": rows,
            "workers": p.workers,
            "teams": p.teams,
            "target": ">= 1.5",
        }
    return out


def merge(path: Path, figures: dict[str, Any], p: Params) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for key, value in figures.items():
        doc[key] = {**value, "when": when, "delay_ms_each_way": p.delay_ms, "cpus": os.cpu_count()}
    return doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="few rounds and short runs (a smoke run)")
    parser.add_argument("--out", type=Path, default=REPO / "bench-results.json")
    args = parser.parse_args(argv)
    p = QUICK if args.quick else Params()
    started = time.time()

    def say(what: str) -> None:
        print(f"[{time.time() - started:6.1f}s] {what}", flush=True)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    configure_logging(level="warning")
    try:
        figures = asyncio.run(run(p, say))
    finally:
        for proc in list(_PROCS):
            _stop(proc)
    doc = merge(args.out, figures, p)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    c, rep = figures["pg_concurrency"], figures["pg_replicas"]
    print(
        f"pg_concurrency.ratio_16_to_1 = {c['ratio_16_to_1']} (one {c['one_post_ms']} ms, 16 {c['burst_16_ms']} ms)"
    )
    print(f"pg_replicas.ratio_3_to_1 = {rep['ratio_3_to_1']} ({json.dumps(rep['replicas'])})")
    print(f"written to {args.out} (under pg_concurrency, pg_replicas)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
