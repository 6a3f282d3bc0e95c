"""Benchmark writes on PostgreSQL one network round trip away: do writes to different launches
wait for each other, and do replicas add launches per second?

A real PostgreSQL server is started as the tests start it (:mod:`tests.support.pg_server`), and
every replica (``nymph queue serve`` subprocesses on free 127.0.0.1 ports) reaches it through a
TCP proxy on loopback that delays every byte 1 ms each way (:mod:`tests.support.latency_proxy`,
a process of its own), as a database in another machine of the zone would:

* ``pg_concurrency``: one replica. The time of one launch POST (the median of ``rounds``, one at
  a time), and of 16 POSTs of different launches sent at once (the median of ``rounds``
  bursts); ``ratio_16_to_1`` is the second over the first (target <= 2.0: with writes waiting
  for each other 16 would take about 16 times one). POSTs that reach the replica together are
  written together (:mod:`nymph.queue.launchbatch`): a burst is a few writes, and
  ``launches_per_batch`` says how many launches each took on average. The POSTs come from a lean load generator
  (:mod:`benchmarks.rawpost`), whose CPU takes little from the two cores the replica,
  PostgreSQL and the proxy share; the same run with nymph's own client as the load is kept
  beside it (``queue_client``). The tests' server does not flush commits to
  disk; the same is measured again on one that does (``durable``: ``fsync`` and
  ``synchronous_commit`` on, as in production), where a lock held until a commit is held for
  its flush too. Beside it, what else bounds a burst: the
  replica's own CPU for one (``replica_cpu_ms_per_burst``: one Python process runs on one core
  at a time), and, from ``pg_stat_activity`` sampled during as many bursts again (after the
  timed ones, so that the sampling's own queries do not slow those), the share of the
  database's busy backends that were waiting for a lock (``lock_wait_share``).
* ``pg_replicas``: 1 replica, then 3 on one fresh database each time. ``workers`` loops, each a
  daemon of its own team (``teams`` namespaces, each with its own kube namespace; claims of one
  namespace take a lock of that namespace), each spread over the replicas: POST a launch,
  claim (capacity 1), complete what it got. Launches completed per second over ``seconds``
  (after a warm-up), and each process's CPU (% of one core) meanwhile; ``ratio_3_to_1`` is 3
  replicas' rate over 1's (target >= 1.5). Each replica is held to ``replica_cpu`` cores (a
  cgroup CPU quota, :mod:`benchmarks.cpulimit`), as a replica Pod with ``resources.limits.cpu``
  is, or one on a node of its own, and serves ``loops_per_replica`` loops (3 replicas serve three
  times as many): what a replica adds is then a replica's worth of CPU and of load, which shows
  whether the database lets their writes run side by side (with one global write lock, three
  replicas would write no faster than one). The same pair runs again without limits and with
  ``workers`` loops whatever the count (under ``unlimited``): there one replica does not fill a
  core, and the replicas, PostgreSQL, the proxy and this load share the machine's cores, so
  more replicas cannot add much.

* ``pg_relay``: two replicas; ``relay_daemons`` daemons (the many-daemons benchmark's load
  generator, each node offering 8 CPUs) park their claims on the second, and launches that
  request 64 CPUs are POSTed to the first. The second replica's CPU per such launch: the wake
  each launch sends it through the database says what the launch needs, so it wakes none of
  its claims (a wake that said only "a task came" would have each claim read, one launch after
  another).

Merges its figures into ``bench-results.json`` under ``pg_concurrency``, ``pg_replicas`` and
``pg_relay`` (the file's other keys are kept); ``daemon_bench.py --markdown`` shows them on
docs/performance.md.

    .venv/bin/python benchmarks/pg_bench.py [--quick] [--only pg_relay,...] [--out bench-results.json]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import functools
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import daemons_bench, sigterm  # noqa: E402
from benchmarks.cpulimit import CpuLimits, cpu_limits  # noqa: E402
from benchmarks.rawpost import RawPoster  # noqa: E402
from benchmarks.scoreboard.procstat import context_switches, cpu  # noqa: E402
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
    #: Single POSTs and bursts timed (their medians are compared): with 15, separate runs of
    #: the same code gave ratios 0.25 apart.
    rounds: int = 60
    #: Bursts sent before the timed ones, unmeasured: every one of the replica's pooled
    #: connections has then run each of a launch's statements more than psycopg's five times,
    #: after which it runs them prepared, as a replica does once it has served a while.
    warmup_bursts: int = 20
    seconds: float = 20.0
    warmup: float = 3.0
    workers: int = 18
    teams: int = 6
    delay_ms: float = 1.0
    #: Each replica's CPU limit in cores (a Pod's ``resources.limits.cpu``) for ``pg_replicas``,
    #: and the loops each limited replica serves (3 replicas serve three times as many).
    replica_cpu: float = 0.25
    loops_per_replica: int = 6
    #: ``pg_relay``: daemons whose claims wait on the second replica, launches no node of theirs
    #: fits POSTed to the first, at this rate a second.
    relay_daemons: int = 500
    relay_launches: int = 200
    relay_rate: float = 40.0


QUICK = Params(
    rounds=4,
    seconds=4.0,
    warmup=1.0,
    workers=6,
    teams=3,
    warmup_bursts=3,
    relay_daemons=20,
    relay_launches=10,
    relay_rate=20.0,
)
#: The sections, in the order they run (``--only`` picks some).
SECTIONS = ("pg_concurrency", "pg_replicas", "pg_relay")
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
    admin_token: str = ""
    procs: list[subprocess.Popen[str]] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)

    def cpu_seconds(self) -> list[float]:
        return [cpu(p.pid).own for p in self.procs]


@contextlib.asynccontextmanager
async def replicas(
    db: str, count: int, *, limits: CpuLimits | None = None, cores: float = 0.0
) -> AsyncIterator[Replicas]:
    """``count`` replicas on ``db`` (a URL through the proxy) with a user and a daemon token;
    with ``limits``, each held to ``cores`` CPUs."""

    def tokens(conn: Conn) -> tuple[str, str, str]:
        user, daemon, admin = (
            create_token(conn, role=role).token for role in (Role.USER, Role.DAEMON, Role.ADMIN)
        )
        return user, daemon, admin

    r = Replicas(db=db)
    r.user_token, r.daemon_token, r.admin_token = await asyncio.to_thread(write_once, db, tokens)
    serve = [sys.executable, "-m", "nymph.cli", "--log-level", "warning", "queue", "serve", "--db", db]
    try:
        for _ in range(count):
            proc, url = await asyncio.to_thread(
                _start, [*serve, "--listen", "127.0.0.1:0"], marker="serving on "
            )
            r.procs.append(proc)
            r.urls.append(url)
            if limits is not None:
                limits.limit(proc.pid, cores)
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


async def _batches(url: str, admin_token: str) -> tuple[float, float]:
    """The replica's launch batches so far: (launches they wrote, batches)."""
    got = await daemons_bench.scrape(url, admin_token)
    return got.get("batched_launches", 0.0), got.get("batches", 0.0)


async def _launch(user: QueueClient, team: int) -> str:
    got = await user.launch(provider="bench", mode="tiny", script="true", namespace=f"team-{team}")
    return str(got["instanceId"])


async def _raw_launch(poster: RawPoster, team: int) -> str:
    """The same launch POST as :func:`_launch`, from the lean load generator."""
    status, got = await poster.post(
        f"/v1/namespaces/team-{team}/providers/bench/launch", {"mode": "tiny", "script": "true"}
    )
    if status != 202:
        raise RuntimeError(f"launch answered {status}: {got}")
    return str(got["instanceId"])


# --- the measurements ----------------------------------------------------------------------


class LockSampler:
    """Samples ``pg_stat_activity`` (on the server's own socket, not through the proxy) while
    :attr:`on`: of the samples that found one of ``dbname``'s backends running a statement, the
    share waiting for a lock (a write waiting for another)."""

    def __init__(self, admin_url: str, dbname: str) -> None:
        self.admin_url, self.dbname = admin_url, dbname
        self.on = threading.Event()
        self.stop = threading.Event()
        self.busy = self.locked = 0
        #: The statements that waited, by their start, and how often.
        self.waiting: collections.Counter[str] = collections.Counter()
        self._thread = threading.Thread(target=self._run, name="pg-bench-lock-sampler", daemon=True)

    def __enter__(self) -> LockSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        sql = (
            "SELECT wait_event_type, left(query, 48) FROM pg_stat_activity WHERE datname = %s "
            "AND state = 'active' AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
        )
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            while not self.stop.is_set():
                if not self.on.wait(0.05):
                    continue
                for kind, query in conn.execute(sql, (self.dbname,)).fetchall():
                    self.busy += 1
                    if kind == "Lock":
                        self.locked += 1
                        self.waiting[" ".join(str(query).split())] += 1
                time.sleep(0.001)

    @property
    def share(self) -> float | None:
        return round(self.locked / self.busy, 3) if self.busy else None


async def concurrency(
    db: str, p: Params, sampler: LockSampler, proxy_pid: int, pg_pid: int, *, lean: bool = True
) -> dict[str, Any]:
    """``lean``: POSTs from :class:`~benchmarks.rawpost.RawPoster` (the figure), else from
    nymph's own client (shown beside it: its CPU shares the cores with what is timed)."""
    async with replicas(db, 1) as r:
        await _teams(r, 1)
        async with contextlib.AsyncExitStack() as stack:
            launch: Callable[[int], Awaitable[str]]
            if lean:
                poster = RawPoster(r.urls[0], r.user_token)
                stack.callback(poster.close)
                launch = functools.partial(_raw_launch, poster)
            else:
                client = await stack.enter_async_context(
                    QueueClient(base_url=r.urls[0], token=r.user_token, timeout=60)
                )
                launch = functools.partial(_launch, client)
            for _ in range(p.warmup_bursts):  # warm up (connections, caches), unmeasured
                await asyncio.gather(*(launch(0) for _ in range(BURST)))
            one: list[float] = []
            burst: list[float] = []
            spent = collections.Counter[str]()

            def cpus() -> dict[str, float]:
                # (this load's own CPU is read apart, next to the burst: these reads of /proc
                # cost more than a burst's POSTs)
                return {
                    "replica": cpu(r.procs[0].pid).own,
                    "proxy": cpu(proxy_pid).own,
                    "postgres": tree_cpu(pg_pid),
                }

            switches = context_switches(r.procs[0].pid)
            batched = await _batches(r.urls[0], r.admin_token)
            for _ in range(p.rounds):
                t0 = time.perf_counter()
                await launch(0)
                one.append(time.perf_counter() - t0)
                c0 = cpus()
                load0, t0 = _own_cpu(), time.perf_counter()
                await asyncio.gather(*(launch(0) for _ in range(BURST)))
                burst.append(time.perf_counter() - t0)
                spent["load"] += _own_cpu() - load0
                spent.update({k: v - c0[k] for k, v in cpus().items()})
            switches = context_switches(r.procs[0].pid) - switches
            launches, batches = (
                b - a for a, b in zip(batched, await _batches(r.urls[0], r.admin_token), strict=True)
            )
            # The lock sampler queries the server every millisecond or so: it runs in bursts of
            # its own, after the timed ones, so that its queries (and its thread in this
            # process) take nothing from the bursts that are timed.
            for _ in range(p.rounds):
                sampler.on.set()
                await asyncio.gather(*(launch(0) for _ in range(BURST)))
                sampler.on.clear()
    one_ms, burst_ms = statistics.median(one) * 1000, statistics.median(burst) * 1000
    per_burst = {k: round(1000 * v / p.rounds, 1) for k, v in spent.items()}
    return {
        "one_post_ms": round(one_ms, 1),
        "burst_16_ms": round(burst_ms, 1),
        "ratio_16_to_1": round(burst_ms / one_ms, 2),
        # the replica's own CPU for a burst: one Python process, so at most one core at a time
        "replica_cpu_ms_per_burst": per_burst["replica"],
        # every process's CPU for a burst (the replica, this load, the proxy, PostgreSQL), and
        # what that is spread over this machine's cores: no burst can take less
        "cpu_ms_per_burst": per_burst,
        "cpu_floor_ms": round(sum(per_burst.values()) / (os.cpu_count() or 1), 1),
        # the replica's thread switches per POST (one at a time and in bursts alike): threads
        # handing the interpreter's lock to each other show here
        "replica_context_switches_per_post": round(switches / (p.rounds * (BURST + 1)), 1),
        # launches per write (POSTs that reach the replica together are written together; the
        # single POSTs count, each a write of its own)
        "launches_per_batch": round(launches / batches, 2) if batches else None,
        # of the database's busy backends sampled during as many bursts again (untimed), the
        # share waiting on a lock
        "lock_wait_share": sampler.share,
        "lock_samples": sampler.busy,
        "lock_waits_by_statement": dict(sampler.waiting.most_common(3)),
        "rounds": p.rounds,
        "target": "<= 2.0",
    }


async def throughput(
    db: str, count: int, p: Params, proxy_pid: int, pg_pid: int, limits: CpuLimits | None = None
) -> dict[str, Any]:
    """Launches POSTed, claimed and completed per second by ``p.workers`` loops over ``count``
    replicas (with ``limits``: each held to ``p.replica_cpu`` cores), and each process's CPU
    meanwhile."""
    loops = p.workers if limits is None else p.loops_per_replica * count
    async with replicas(db, count, limits=limits, cores=p.replica_cpu) as r:
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

        workers = [asyncio.create_task(worker(k), name=f"bench-worker-{k}") for k in range(loops)]
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
        "loops": loops,
        "launches": counted,
        "seconds": round(elapsed, 1),
        "replica_cpu_pct": [round(100 * (a - b) / elapsed, 1) for a, b in zip(after, before, strict=True)],
        "proxy_cpu_pct": round(100 * (proxy_after - proxy_before) / elapsed, 1),
        "postgres_cpu_pct": round(100 * (pg_after - pg_before) / elapsed, 1),
        "load_cpu_pct": round(100 * (load_after - load_before) / elapsed, 1),
        "machine_load_1m": round(os.getloadavg()[0], 1),
    }


async def relay(db: str, p: Params) -> dict[str, Any]:
    """``pg_relay``: two replicas on ``db``; ``relay_daemons`` daemons park their claims on the
    second, and ``relay_launches`` launches that no node of theirs fits (each requests more CPU
    than a node offers) are POSTed to the first, ``relay_rate`` a second. What the second
    replica spends for launches it hears of through the database and none of its claims may
    take: its CPU (% of a core) over as long with no launches and while they come, and the
    difference per launch. A wake that says only how many tasks came wakes each waiting claim
    to read, one launch after another."""
    admin = await asyncio.to_thread(write_once, db, lambda conn: create_token(conn, role=Role.ADMIN).token)
    async with replicas(db, 2) as r:
        await _teams(r, 1)
        workers: list[subprocess.Popen[str]] = []
        try:
            # each node offers 8 CPUs (the many-daemons benchmark's load generator)
            await daemons_bench.start_workers(workers, r.urls[1], r.daemon_token, p.relay_daemons, capacity=1)
            if await daemons_bench.wait_parked(r.urls[1], admin, p.relay_daemons) < p.relay_daemons:
                raise RuntimeError("the daemons' claims did not all park")
            sender, receiver = r.procs[0].pid, r.procs[1].pid
            window = p.relay_launches / p.relay_rate + 2.0
            await asyncio.sleep(2.0)  # the registrations' trailing writes
            c0, t0 = cpu(receiver).own, time.monotonic()
            await asyncio.sleep(window)
            idle_pct = 100 * (cpu(receiver).own - c0) / (time.monotonic() - t0)
            unfit = {"resources": {"requests": {"cpu": "64"}}}
            async with QueueClient(base_url=r.urls[0], token=r.user_token, timeout=60) as user:

                async def post() -> None:
                    await user.launch(
                        provider="bench", mode="tiny", script="true", namespace="team-0", fields=unfit
                    )

                s0, c0, t0 = cpu(sender).own, cpu(receiver).own, time.monotonic()
                await daemons_bench._paced(p.relay_launches, p.relay_rate, post)
                await asyncio.sleep(max(0.0, t0 + window - time.monotonic()))
                s1, c1, t1 = cpu(sender).own, cpu(receiver).own, time.monotonic()
            busy_pct = 100 * (c1 - c0) / (t1 - t0)
            waiting = (await daemons_bench.scrape(r.urls[1], admin)).get("waiting", 0)
        finally:
            await asyncio.to_thread(daemons_bench.stop_workers, workers)
    return {
        "daemons": p.relay_daemons,
        "launches": p.relay_launches,
        "rate_per_s": p.relay_rate,
        "receiver_idle_cpu_pct": round(idle_pct, 1),
        "receiver_cpu_pct": round(busy_pct, 1),
        "receiver_cpu_ms_per_launch": round(10 * (busy_pct - idle_pct) * (t1 - t0) / p.relay_launches, 2),
        "sender_cpu_ms_per_launch": round(1000 * (s1 - s0) / p.relay_launches, 2),
        "claims_waiting_after": waiting,
    }


#: What the durable run reports (the rest is in the main run).
DURABLE_KEYS = (
    "one_post_ms",
    "burst_16_ms",
    "ratio_16_to_1",
    "replica_cpu_ms_per_burst",
    "lock_wait_share",
    "lock_samples",
    "lock_waits_by_statement",
)


#: What the run with nymph's own client as the load reports.
CLIENT_KEYS = (
    "one_post_ms",
    "burst_16_ms",
    "ratio_16_to_1",
    "cpu_ms_per_burst",
    "cpu_floor_ms",
    "launches_per_batch",
)


async def durable_concurrency(p: Params) -> dict[str, Any]:
    """``pg_concurrency`` again on a server that flushes each commit to disk before it answers
    (``fsync`` and ``synchronous_commit`` on, as in production): a lock a write holds until its
    commit is held for the flush too, so writes that waited for each other would show here most."""
    with running_server(durable=True) as server, proxy(server, p) as (port, proxy_pid):
        raw = server.fresh_database()
        dbname = raw.split("/", 3)[3].split("?", 1)[0]
        with LockSampler(server.url(), dbname) as sampler:
            assert server.proc is not None
            got = await concurrency(pg_url_through(raw, port), p, sampler, proxy_pid, server.proc.pid)
    return {k: got[k] for k in DURABLE_KEYS}


async def run(p: Params, say: Any, only: tuple[str, ...] = SECTIONS) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with running_server() as server, proxy(server, p) as (port, proxy_pid):
        if "pg_concurrency" in only:
            await _concurrency_section(server, port, proxy_pid, p, say, out)
        if "pg_replicas" in only:
            await _replicas_section(server, port, proxy_pid, p, say, out)
        if "pg_relay" in only:
            say(
                f"pg_relay: {p.relay_daemons} daemons on one replica, launches no node fits POSTed to the other"
            )
            out["pg_relay"] = await relay(pg_url_through(server.fresh_database(), port), p)
            say(f"  {out['pg_relay']}")
    return out


async def _concurrency_section(
    server: PgServer, port: int, proxy_pid: int, p: Params, say: Any, out: dict[str, Any]
) -> None:
    say("pg_concurrency")
    raw = server.fresh_database()
    dbname = raw.split("/", 3)[3].split("?", 1)[0]
    with LockSampler(server.url(), dbname) as sampler:
        assert server.proc is not None
        out["pg_concurrency"] = await concurrency(
            pg_url_through(raw, port), p, sampler, proxy_pid, server.proc.pid
        )
    say(f"  {out['pg_concurrency']}")
    say("pg_concurrency with nymph's own client as the load")
    raw = server.fresh_database()
    dbname = raw.split("/", 3)[3].split("?", 1)[0]
    with LockSampler(server.url(), dbname) as sampler:
        got = await concurrency(pg_url_through(raw, port), p, sampler, proxy_pid, server.proc.pid, lean=False)
    out["pg_concurrency"]["queue_client"] = {k: got[k] for k in CLIENT_KEYS}
    say(f"  {out['pg_concurrency']['queue_client']}")
    say("pg_concurrency on a durable server")
    out["pg_concurrency"]["durable"] = await durable_concurrency(p)
    say(f"  {out['pg_concurrency']['durable']}")


async def _replicas_section(
    server: PgServer, port: int, proxy_pid: int, p: Params, say: Any, out: dict[str, Any]
) -> None:
    runs: dict[str, dict[str, Any]] = {"limited": {}, "unlimited": {}}
    with cpu_limits() as limits:
        if limits.root is None:
            say(f"pg_replicas: no CPU limit can be set here ({limits.reason}): unlimited only")
        for kind in ("limited", "unlimited"):
            if kind == "limited" and limits.root is None:
                continue
            for count in (1, 3):
                say(f"pg_replicas: {count} ({kind})")
                db = pg_url_through(server.fresh_database(), port)
                assert server.proc is not None
                runs[kind][str(count)] = await throughput(
                    db, count, p, proxy_pid, server.proc.pid, limits if kind == "limited" else None
                )
                say(f"  {runs[kind][str(count)]}")

    def ratio(rows: dict[str, Any]) -> float | None:
        if not rows:
            return None
        return round(rows["3"]["launches_per_s"] / max(rows["1"]["launches_per_s"], 1e-9), 2)

    out["pg_replicas"] = {
        "ratio_3_to_1": ratio(runs["limited"]),
        "replica_cpu_limit": p.replica_cpu if runs["limited"] else None,
        "loops_per_replica": p.loops_per_replica,
        "replicas": runs["limited"],
        "unlimited": {"ratio_3_to_1": ratio(runs["unlimited"]), "replicas": runs["unlimited"]},
        "workers": p.workers,
        "teams": p.teams,
        "target": ">= 1.5",
    }


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
    parser.add_argument(
        "--only",
        default=",".join(SECTIONS),
        help=f"the sections to run, comma-separated (default: all, {','.join(SECTIONS)})",
    )
    args = parser.parse_args(argv)
    only = tuple(x.strip() for x in args.only.split(",") if x.strip())
    unknown = sorted(set(only) - set(SECTIONS))
    if unknown or not only:
        parser.error(
            f"--only takes some of {', '.join(SECTIONS)}" + (f", not {', '.join(unknown)}" if unknown else "")
        )
    p = QUICK if args.quick else Params()
    started = time.time()

    def say(what: str) -> None:
        print(f"[{time.time() - started:6.1f}s] {what}", flush=True)

    configure_logging(level="warning")
    try:
        figures = asyncio.run(run(p, say, only))
    finally:
        for proc in list(_PROCS):
            _stop(proc)
    doc = merge(args.out, figures, p)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    if "pg_concurrency" in figures:
        c = figures["pg_concurrency"]
        print(
            f"pg_concurrency.ratio_16_to_1 = {c['ratio_16_to_1']} (one {c['one_post_ms']} ms, 16 {c['burst_16_ms']} ms)"
        )
    if "pg_replicas" in figures:
        rep = figures["pg_replicas"]
        print(f"pg_replicas.ratio_3_to_1 = {rep['ratio_3_to_1']} ({json.dumps(rep['replicas'])})")
    if "pg_relay" in figures:
        r = figures["pg_relay"]
        print(
            f"pg_relay.receiver_cpu_ms_per_launch = {r['receiver_cpu_ms_per_launch']} "
            f"({r['daemons']} daemons; {r['receiver_cpu_pct']}% of a core, {r['receiver_idle_cpu_pct']}% idle)"
        )
    print(f"written to {args.out} (under {', '.join(figures)})")
    return 0


if __name__ == "__main__":
    sigterm.unwind_on_sigterm()
    sys.exit(main())
