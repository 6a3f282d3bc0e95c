"""1, 100 and 1,000 daemons long-polling one queue, and a steady launch stream: how fast a launch
reaches a claiming daemon, and what the queue spends, as the number of daemons grows.

For each daemon count, a fresh SQLite queue (``nymph queue serve``) and load-generator processes
(250 daemons each, one aiohttp session per process): every daemon registers its own session
with its own node offer, holds a claim long-poll (capacity 1,000 / daemons, so every count has
the same total capacity), and completes and reports stopped what it claims in the background,
as a real one would. Each daemon holds its long-polls as long as the daemon does by default
(``poll_wait``, 50 s), its first one for a random part of that (daemons start at different
times), so the long-polls timing out and sent again are spread evenly, as in a cluster. Once
every claim is parked, the queue's CPU is read for one whole hold (every long-poll times out and
is sent again once: the idle figure); then launches are POSTed at a steady rate. The latency is
the queue's own histogram (``nymph_queue_launch_claim_seconds`` from ``GET /metrics``: a launch's
POST to the claim answer carrying it), so the generator's delays do not count; the queue's CPU
(``/proc``) over the stream, the long-polls timing out meanwhile included, is divided by the
launches. Every count's queue and daemons are up together, and the stream runs ``rounds`` times
(5) on each, every count's stream of a round at the same time (``--take-turns``: one count after
the other), so that a slow spell of the machine falls on every count alike; the CPU per launch
is the median of a count's rounds (each round's is kept beside it), and the ratio of the
largest count's to one daemon's is the median of the rounds' own ratios (the ratio of the two
medians is kept beside it). Last, 500 launches that no daemon's node can run are POSTed to each
count's queue at the same rate: its CPU per such launch (``backlog_cpu_ms_per_launch``: their
wake-ups included), then its CPU while they wait (``backlog_cpu_pct``: the sweeps that give each
its reason, against every live daemon's offer). Writes ``daemons_1000`` into ``bench-results.json``
(its other keys kept):

    .venv/bin/python benchmarks/daemons_bench.py [--rate 40] [--seconds 15] [--rounds 3] [--counts 1,100,1000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import json
import math
import os
import random
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import aiohttp  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from benchmarks import schedule_bench, sigterm  # noqa: E402
from benchmarks.scoreboard.load_pages import paired_ratios  # noqa: E402
from nymph.client import DaemonIdentity, DispatchClient  # noqa: E402
from nymph.daemon.settings import DaemonQueueSettings  # noqa: E402
from nymph.logsetup import configure_logging  # noqa: E402
from nymph.queue.auth import create_token  # noqa: E402
from nymph.queue.models import Role  # noqa: E402

PER_PROCESS = 250
#: Launches all daemons together may hold at once (each daemon's claim capacity is its share).
TOTAL_CAPACITY = 1000
#: The long-poll hold: the daemon's own default.
CLAIM_WAIT = DaemonQueueSettings().poll_wait
TICKS = os.sysconf("SC_CLK_TCK")
#: Streams per daemon count, one after the other on the same daemons: the queue's CPU per
#: launch is the median of theirs.
ROUNDS = 5
#: Launches no daemon's node can run, queued after the streams, and how long the queue's CPU is
#: read while they wait (several sweeps: one every 5 s).
BACKLOG = 500
BACKLOG_SECONDS = 16.0
#: More CPU than any daemon's node offers (:func:`_offer`).
UNFIT_CPU = "64"


# --- one load-generator process ----------------------------------------------------------------


def _offer(i: int) -> dict[str, Any]:
    return {"name": f"bn-{i}", "labels": {}, "taints": [], "allocatable": {"cpu": "8", "memory": "32Gi"}}


async def _finish(client: DispatchClient, name: str, node: str, task: Any, seq: int) -> None:
    await client.complete(daemon_id=name, task_id=task["taskId"], ok=True)
    report = {"seq": seq, "instanceId": task["instanceId"], "state": "stopped", "reason": "Completed"}
    await client.report(daemon_id=name, stream=f"{name}-bench", reports=[{**report, "node": node}])


async def _daemon(
    url: str, token: str, i: int, capacity: int, session: aiohttp.ClientSession, ready: asyncio.Event
) -> None:
    """Claims up to ``capacity`` at a time and finishes each in the background (as the daemon's
    work queue does), so the next claim is parked again at once."""
    name, node = f"bd-{i}", f"bn-{i}"
    client = DispatchClient(
        base_url=url,
        token=token,
        session=session,
        timeout=60,
        daemon=DaemonIdentity(daemon_id=name, node=node),
    )
    await client.claim(daemon_id=name, node=node, capacity=1, wait=0, node_info=_offer(i))
    ready.set()
    seq = 0
    finishing: set[asyncio.Task[None]] = set()
    # Daemons that started at different times: the first hold is spread over a whole one, so
    # the long-polls that time out (and are sent again) are spread evenly over time.
    wait = random.Random(i).uniform(1.0, CLAIM_WAIT + 1.0)
    while True:
        tasks = await client.claim(
            daemon_id=name,
            node=node,
            capacity=capacity,
            wait=wait,
            lease_seconds=600,
            node_info=_offer(i),
        )
        wait = CLAIM_WAIT
        for t in tasks:
            seq += 1
            job = asyncio.create_task(_finish(client, name, node, t, seq), name=f"bench-finish-{name}-{seq}")
            finishing.add(job)
            job.add_done_callback(finishing.discard)
        for job in [j for j in finishing if j.done()]:
            job.result()


async def worker(url: str, token: str, first: int, count: int, capacity: int) -> None:
    """``count`` daemons from index ``first``; prints ``ready`` once each has registered."""
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        readies = [asyncio.Event() for _ in range(count)]
        runs = [
            asyncio.create_task(
                _daemon(url, token, first + k, capacity, session, readies[k]), name=f"bench-daemon-{k}"
            )
            for k in range(count)
        ]
        await asyncio.gather(*(r.wait() for r in readies))
        print("ready", flush=True)
        done, _ = await asyncio.wait(runs, return_when=asyncio.FIRST_EXCEPTION)
        for d in done:
            d.result()  # a daemon's failure ends the worker loudly


# --- the measurement ---------------------------------------------------------------------------


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


async def scrape(url: str, token: str) -> dict[str, Any]:
    """What a replica's ``GET /metrics`` says of its claims and launch batches."""
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"}) as resp,
    ):
        resp.raise_for_status()
        text = await resp.text()
    buckets: list[tuple[float, float]] = []
    out: dict[str, Any] = {"buckets": buckets}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "nymph_queue_launch_claim_seconds_bucket":
                buckets.append((float(sample.labels["le"]), sample.value))
            elif sample.name == "nymph_queue_launch_claim_seconds_count":
                out["count"] = int(sample.value)
            elif sample.name == "nymph_queue_claims_waiting":
                out["waiting"] = int(sample.value)
            elif sample.name == "nymph_queue_launch_batch_launches_sum":
                out["batched_launches"] = sample.value
            elif sample.name == "nymph_queue_launch_batch_launches_count":
                out["batches"] = sample.value
    buckets.sort()
    return out


def quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """The ``q`` quantile of a cumulative histogram, linear within its bucket (as Prometheus's
    ``histogram_quantile``); None when it is empty."""
    total = buckets[-1][1] if buckets else 0
    if not total:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, cum in buckets:
        if cum >= rank:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * ((rank - below) / (cum - below) if cum > below else 1.0)
        lower, below = bound, cum
    return lower


@dataclasses.dataclass
class Fleet:
    """One daemon count's queue and its parked daemons, ready for launch streams."""

    n: int
    url: str
    admin: str
    pid: int
    user: Any
    parked: int
    idle_pct: float
    per_round: list[float] = dataclasses.field(default_factory=list)
    backlog_ms: float | None = None
    backlog_pct: float | None = None

    async def stream(self, *, rate: float, seconds: float, settle: float) -> float:
        """POST ``rate`` launches a second for ``seconds``, wait until every one is claimed;
        the queue's CPU per launch (ms), kept as a round."""
        total = int(rate * seconds)
        c1 = _cpu_seconds(self.pid)
        await _paced(total, rate, lambda: schedule_bench.launch(self.user))
        want = total * (len(self.per_round) + 1)
        deadline = time.monotonic() + 120
        got = await scrape(self.url, self.admin)
        while got.get("count", 0) < want and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            got = await scrape(self.url, self.admin)
        await asyncio.sleep(settle)  # the last completions and reports
        self.per_round.append(1000 * (_cpu_seconds(self.pid) - c1) / total)
        return self.per_round[-1]

    async def backlog(self, *, launches: int, rate: float, seconds: float) -> tuple[float, float]:
        """POST ``launches`` that no daemon's node can run (each requests more CPU than any node
        offers) at ``rate`` a second: the queue's CPU per such launch (ms), from the first POST
        to 2 s after the last (their wake-ups included); then its CPU over ``seconds`` (% of one
        core) while they wait (the sweeps give each a reason, against every daemon's offer)."""
        c0 = _cpu_seconds(self.pid)
        unfit = {"requests": {"cpu": UNFIT_CPU}}
        await _paced(launches, rate, lambda: schedule_bench.launch(self.user, resources=unfit))
        await asyncio.sleep(2.0)
        c1, t1 = _cpu_seconds(self.pid), time.monotonic()
        self.backlog_ms = 1000 * (c1 - c0) / launches
        await asyncio.sleep(seconds)
        self.backlog_pct = 100 * (_cpu_seconds(self.pid) - c1) / (time.monotonic() - t1)
        return self.backlog_ms, self.backlog_pct

    async def row(self, *, launches: int) -> dict[str, Any]:
        got = await scrape(self.url, self.admin)
        p50, p95 = quantile(got["buckets"], 0.5), quantile(got["buckets"], 0.95)
        return {
            "daemons": self.n,
            "parked": self.parked,
            "launches": launches,
            "claimed": got.get("count", 0),
            "p50_ms": round(p50 * 1000, 1) if p50 is not None else None,
            "p95_ms": round(p95 * 1000, 1) if p95 is not None else None,
            # the median of the rounds: one round can take in a burst of this machine's own
            # (another process, the page cache) that the others do not
            "cpu_ms_per_launch": round(statistics.median(self.per_round), 2),
            "cpu_ms_per_launch_rounds": [round(c, 2) for c in self.per_round],
            "idle_cpu_pct": round(self.idle_pct, 2),
            "backlog_cpu_ms_per_launch": None if self.backlog_ms is None else round(self.backlog_ms, 2),
            "backlog_cpu_pct": None if self.backlog_pct is None else round(self.backlog_pct, 2),
        }


async def _paced(count: int, rate: float, post: Callable[[], Awaitable[object]]) -> None:
    """``count`` POSTs at ``rate`` a second (each sent on time, however long the ones before
    take), all answered."""
    started = time.monotonic()
    posts = []
    for k in range(count):
        delay = started + k / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        posts.append(asyncio.create_task(post()))
    await asyncio.gather(*posts)


async def start_workers(
    workers: list[subprocess.Popen[str]], url: str, token: str, daemons: int, *, capacity: int
) -> None:
    """Load-generator processes (:data:`PER_PROCESS` daemons each, added to ``workers`` as each
    starts, for the caller to stop with :func:`stop_workers`) whose ``daemons`` daemons register
    on ``url`` with ``token``; returns once every process has said it is ready."""
    for first in range(0, daemons, PER_PROCESS):
        count = min(PER_PROCESS, daemons - first)
        argv = [sys.executable, __file__, "--worker", url, str(first), str(count), str(capacity)]
        workers.append(
            await asyncio.to_thread(
                subprocess.Popen,
                argv,
                stdout=subprocess.PIPE,
                text=True,
                env={**os.environ, "NYMPH_BENCH_DAEMON_TOKEN": token},
                start_new_session=True,
            )
        )
    for w in workers:
        assert w.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(w.stdout.readline), 300)
        if line.strip() != "ready":
            raise RuntimeError(f"a load-generator process did not start: {line!r}")


async def wait_parked(url: str, admin: str, daemons: int, *, timeout: float = 60.0) -> int:
    """How many claims wait on ``url`` once ``daemons`` do, or ``timeout`` seconds passed."""
    deadline = time.monotonic() + timeout
    # polling another process's metrics: there is no event to wait on
    while (await scrape(url, admin)).get("waiting", 0) < daemons and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.2)
    return int((await scrape(url, admin)).get("waiting", 0))


def stop_workers(workers: list[subprocess.Popen[str]]) -> None:
    for w in workers:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(w.pid, signal.SIGTERM)
    for w in workers:
        try:
            w.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(w.pid, signal.SIGKILL)
            w.wait(5)


@contextlib.asynccontextmanager
async def fleet(n: int, *, idle_s: float, say: Any) -> AsyncIterator[Fleet]:
    """A fresh queue, ``n`` daemons from load-generator processes, every claim parked and the
    queue's idle CPU read; stopped on leaving."""
    with tempfile.TemporaryDirectory(prefix="nymph-daemons-bench-") as tmp:
        db = str(Path(tmp) / "queue.db")
        admin = await asyncio.to_thread(
            schedule_bench.write, db, lambda conn: create_token(conn, role=Role.ADMIN).token
        )
        async with schedule_bench.queue(db) as q:
            assert q.proc is not None
            workers: list[subprocess.Popen[str]] = []
            try:
                # the same total capacity whatever the count: one daemon takes 1,000 at a time
                await start_workers(workers, q.url, q.daemon_token, n, capacity=max(1, TOTAL_CAPACITY // n))
                parked = await wait_parked(q.url, admin, n)
                say(f"  {n} daemons: {parked} claims parked")
                c0, t0 = _cpu_seconds(q.proc.pid), time.monotonic()
                await asyncio.sleep(idle_s)
                idle_pct = 100 * (_cpu_seconds(q.proc.pid) - c0) / (time.monotonic() - t0)
                yield Fleet(
                    n=n,
                    url=q.url,
                    admin=admin,
                    pid=q.proc.pid,
                    user=q.user(),
                    parked=parked,
                    idle_pct=idle_pct,
                )
            finally:
                await asyncio.to_thread(stop_workers, workers)


def summarize(
    rows: dict[int, dict[str, Any]], *, rate: float, seconds: float, backlog: int = BACKLOG
) -> dict[str, Any]:
    """The ``daemons_1000`` section: the largest count's figures and its ratios to one daemon."""
    one, top = rows[min(rows)], rows[max(rows)]

    def ratio(key: str) -> float | None:
        a, b = top.get(key), one.get(key)
        return round(a / b, 2) if a is not None and b else None

    of_medians = ratio("cpu_ms_per_launch")
    paired = paired_ratios(one.get("cpu_ms_per_launch_rounds"), top.get("cpu_ms_per_launch_rounds"))
    return {
        "p50_ms": top["p50_ms"],
        "p95_ms": top["p95_ms"],
        "p95_ratio": ratio("p95_ms"),
        # The median of the rounds' own ratios: the two streams of a round ran at the same time
        # (or one after the other), so they met the same pace of the machine, which a ratio of
        # the two counts' medians (of rounds that met different paces) does not cancel out.
        "cpu_ms_per_launch_ratio": round(statistics.median(paired), 2) if paired else of_medians,
        "cpu_ms_per_launch_round_ratios": paired,
        "cpu_ms_per_launch_ratio_of_medians": of_medians,
        "idle_cpu_pct": top["idle_cpu_pct"],
        "backlog_cpu_ms_per_launch": top.get("backlog_cpu_ms_per_launch"),
        "backlog_cpu_pct": top.get("backlog_cpu_pct"),
        "backlog_launches": backlog,
        "runs": {str(n): r for n, r in sorted(rows.items())},
        "rate_per_s": rate,
        "seconds": seconds,
        "poll_wait_s": CLAIM_WAIT,
        "cpus": os.cpu_count(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _raise_fd_limit() -> None:
    """A thousand long-polls need more descriptors than the usual soft limit of 1,024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 8192 if hard == resource.RLIM_INFINITY else min(hard, 8192)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


async def run(
    counts: list[int],
    *,
    rate: float,
    seconds: float,
    idle_s: float = CLAIM_WAIT + 2,
    rounds: int = ROUNDS,
    backlog_s: float = BACKLOG_SECONDS,
    backlog: int = BACKLOG,
    together: bool = True,
) -> dict[str, Any]:
    say = functools.partial(print, flush=True)
    async with contextlib.AsyncExitStack() as stack:
        # Every count's queue and daemons stay up together, and each round's streams run at
        # the same time (or, with ``together`` off, take turns: 1, 100, 1,000, then again): a
        # spell of this machine's (another process, the page cache, the CPU's clock) falls on
        # every count alike, not on one count's rounds.
        fleets = [await stack.enter_async_context(fleet(n, idle_s=idle_s, say=say)) for n in counts]
        settle = min(1.0, idle_s)
        for r in range(rounds):
            if together:
                cpus = await asyncio.gather(
                    *(f.stream(rate=rate, seconds=seconds, settle=settle) for f in fleets)
                )
            else:
                cpus = [await f.stream(rate=rate, seconds=seconds, settle=settle) for f in fleets]
            for f, cpu in zip(fleets, cpus, strict=True):
                say(f"  round {r + 1}: {f.n} daemons, queue CPU {cpu:.2f} ms/launch")
        if backlog_s > 0 and backlog > 0:
            for f in fleets:
                ms, pct = await f.backlog(launches=backlog, rate=rate, seconds=backlog_s)
                say(
                    f"  {f.n} daemons, {backlog} launches no node fits: queue CPU {ms:.2f} ms/launch, "
                    f"then {pct:.2f}% of a core while they wait"
                )
        rows = {f.n: await f.row(launches=int(rate * seconds) * rounds) for f in fleets}
    for n, row in rows.items():
        say(
            f"  {n} daemons: POST -> claim p50 {row['p50_ms']} ms, p95 {row['p95_ms']} ms; "
            f"queue CPU {row['cpu_ms_per_launch']} ms/launch (rounds: {row['cpu_ms_per_launch_rounds']}), "
            f"idle {row['idle_cpu_pct']}%; launches no node fits {row['backlog_cpu_ms_per_launch']} ms/launch, "
            f"then {row['backlog_cpu_pct']}% while they wait"
        )
    return {
        **summarize(rows, rate=rate, seconds=seconds, backlog=backlog),
        "rounds": rounds,
        "counts_together": together,
        "counts_take_turns": not together,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        url, first, count, capacity = argv[1], int(argv[2]), int(argv[3]), int(argv[4])
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        asyncio.run(worker(url, os.environ["NYMPH_BENCH_DAEMON_TOKEN"], first, count, capacity))
        return 0
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=float, default=40.0, help="launches per second (default 40)")
    parser.add_argument("--seconds", type=float, default=15.0, help="length of the stream (default 15)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=ROUNDS,
        help=f"streams per daemon count; the CPU per launch is their median (default {ROUNDS})",
    )
    parser.add_argument("--counts", default="1,100,1000", help="daemon counts (default 1,100,1000)")
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=CLAIM_WAIT + 2,
        help=f"idle CPU sampled this long (default {CLAIM_WAIT + 2:g}: every long-poll times out once)",
    )
    parser.add_argument(
        "--backlog",
        type=int,
        default=BACKLOG,
        help=f"launches no node fits, POSTed after the streams (default {BACKLOG}; 0: none)",
    )
    parser.add_argument(
        "--backlog-seconds",
        type=float,
        default=BACKLOG_SECONDS,
        help="the queue's CPU is read this long while the launches no node fits wait "
        f"(default {BACKLOG_SECONDS:g}; 0: neither is measured)",
    )
    parser.add_argument(
        "--take-turns",
        action="store_true",
        help="run each round's streams one count after the other, not all at the same time",
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench-results.json")
    parser.add_argument("--no-write", action="store_true", help="print the figures only")
    args = parser.parse_args(argv)
    counts = sorted({int(c) for c in args.counts.split(",")})
    _raise_fd_limit()
    configure_logging(level="warning")
    try:
        if args.rounds < 1:
            parser.error("--rounds must be at least 1")
        section = asyncio.run(
            run(
                counts,
                rate=args.rate,
                seconds=args.seconds,
                idle_s=args.idle_seconds,
                rounds=args.rounds,
                backlog_s=args.backlog_seconds,
                backlog=args.backlog,
                together=not args.take_turns,
            )
        )
    finally:
        for proc in list(schedule_bench._PROCS):
            schedule_bench._stop(proc)
    print(json.dumps({k: v for k, v in section.items() if k != "runs"}))
    if not args.no_write:
        doc: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
        doc["daemons_1000"] = section
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"written to {args.out} (under daemons_1000)")
    return 0


if __name__ == "__main__":
    sigterm.unwind_on_sigterm()
    sys.exit(main())
