"""Benchmark the queue's scheduler with a backlog: does a claim cost the same with 1,000 or
100,000 launches queued, does an unrunnable backlog stall a runnable launch, does a small team
wait behind a big one, and does a page of queued instances stay quick?

For each backend (a fresh SQLite file; a fresh database on a PostgreSQL server started like the
tests start it, skipped with a note when its binaries are missing), ``nymph queue serve`` runs
as a subprocess on a free 127.0.0.1 port, and this process talks to it over HTTP with the
queue's own client:

* **backlog**: for each size (1,000 / 10,000 / 100,000), a fresh database with that many queued
  launches in one namespace, written straight into the database in bulk (copies of one launched
  through the API, as ``tests/queue/test_scheduling_queue.py``'s ``seed()`` does; on PostgreSQL
  then analyzed, as autovacuum soon would). Then S launch
  POSTs through the API (p50/p95), and S claims by one daemon with a CPU node offer, each taking
  one task (capacity 1, ``wait=0``), which the daemon then completes and reports stopped (as a
  real daemon does once the Pod has run), so the running set stays as small as a healthy
  cluster's and every claim meets the whole backlog (p50/p95). Then one ``GET
  .../instances?limit=500`` page of that namespace (its queued launches' waiting reasons are
  worked out when read), S times. The ratios of the largest backlog's p50 to the smallest's
  are ``claim_p50_ratio_100k_to_1k`` and ``post_p50_ratio_100k_to_1k`` (target <= 1.5).
* **starvation**: 100,000 queued launches whose ``node_selector`` (``pool: gpu``) no live node
  has, then one runnable launch in the same namespace, while a daemon with a CPU node offer
  holds a claim long-poll: the time from the POST to the claim answer that hands it out,
  repeated (``starvation_ms``).
* **fair share**: namespace A with 10,000 queued, namespace B with 10 queued after them; one
  daemon of capacity 1 claims, completes and reports in a loop: when (from the loop's start) B's
  10 launches and A's first 10 were handed out (``share_10k_vs_10``).

Merges its figures into ``bench-results.json`` under ``scheduling`` (one key per backend; the
file's other keys, and a backend not run now, are kept); ``daemon_bench.py --markdown`` shows
them on docs/performance.md.

    .venv/bin/python benchmarks/schedule_bench.py [--backend sqlite|postgresql|both] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import sigterm  # noqa: E402
from nymph.client import QueueClient  # noqa: E402
from nymph.logsetup import configure_logging  # noqa: E402
from nymph.queue.auth import create_token  # noqa: E402
from nymph.queue.models import Role  # noqa: E402
from nymph.queue.sql.dialect import Conn  # noqa: E402
from nymph.queue.sql.schedule import group_of  # noqa: E402

CPU_NODE = {
    "name": "cpu-1",
    "labels": {"pool": "cpu"},
    "taints": [],
    "allocatable": {"cpu": "64", "memory": "256Gi"},
}
GPU_ONLY = {"node_selector": {"pool": "gpu"}}
TEAM_A, TEAM_B = "team-a", "team-b"


@dataclass(frozen=True)
class Params:
    sizes: tuple[int, ...] = (1_000, 10_000, 100_000)
    samples: int = 200
    #: Seconds of claims (and of POSTs) per backlog after which sampling stops, once it has
    #: ``min_samples`` (a claim that grows with the backlog would keep the run going for hours).
    sample_seconds: float = 60.0
    min_samples: int = 20
    page_samples: int = 10
    starvation_backlog: int = 100_000
    starvation_samples: int = 20
    share_big: int = 10_000
    share_small: int = 10
    #: Claims after which the fair-share loop gives up waiting for the small team's launches.
    share_claim_cap: int = 1_000


QUICK = Params(
    sizes=(100, 1_000),
    samples=10,
    sample_seconds=60.0,
    min_samples=10,
    page_samples=2,
    starvation_backlog=1_000,
    starvation_samples=3,
    share_big=200,
    share_small=10,
    share_claim_cap=1_000,
)


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return round(ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo), 2)


def summary(ms: list[float]) -> dict[str, Any]:
    return {"p50": pct(ms, 50), "p95": pct(ms, 95), "max": round(max(ms), 2), "samples": len(ms)}


# --- the database, written to directly (tokens, the seeded backlog) --------------------------


def write(db: str, fn: Callable[[Conn], Any]) -> Any:
    """One write transaction on ``db`` (a SQLite path or a PostgreSQL URL), migrating first."""
    from nymph.queue.pgdb import is_url, write_once

    if is_url(db):
        return write_once(db, fn)
    from nymph.queue.db import connect, transaction

    conn = connect(Path(db))
    try:
        with transaction(conn, write=True):
            return fn(conn)
    finally:
        conn.close()


def seed(db: str, *, template: str, count: int, tag: str) -> float:
    """``count`` queued launches copied from the queued launch ``template`` (its namespace, spec
    and group), queued an hour ago (older than anything POSTed next); returns the seconds taken."""
    t0 = time.perf_counter()

    def read(conn: Conn) -> Any:
        return dict(conn.execute("SELECT * FROM tasks WHERE instance_id = ?", (template,)).fetchone())

    t = write(db, read)
    ns, kube_ns = t["namespace"], t["kube_namespace"]
    spec = json.loads(t["spec"])
    grp = group_of(kind="launch", namespace=ns, kube_namespace=kube_ns, spec=spec)
    base = time.time() - 3600

    def chunk(start: int, stop: int) -> Callable[[Conn], None]:
        def copy(conn: Conn) -> None:
            for lo in range(start, stop, 500):
                ids = [f"seed-{tag}-{k:07d}" for k in range(lo, min(stop, lo + 500))]
                conn.execute(
                    "INSERT INTO instances (instance_id, namespace, provider, kube_namespace, state, "
                    "message, launched_at, updated_at, version, requester) VALUES "
                    + ",".join("(?, ?, ?, ?, 'queued', '', ?, ?, 1, 'seed')" for _ in ids),
                    [v for i in ids for v in (i, ns, t["provider"], kube_ns, base, base)],
                )
                conn.execute(
                    "INSERT INTO tasks (task_id, kind, status, namespace, kube_namespace, provider, "
                    "instance_id, spec, requester, created_at, updated_at, grp, priority) VALUES "
                    + ",".join("(?, 'launch', 'pending', ?, ?, ?, ?, ?, 'seed', ?, ?, ?, 0)" for _ in ids),
                    [
                        v
                        for i in ids
                        for v in (
                            f"task-{i}",
                            ns,
                            kube_ns,
                            t["provider"],
                            i,
                            json.dumps({**spec, "instanceId": i}),
                            base,
                            base,
                            grp,
                        )
                    ],
                )

        return copy

    # Commits of 10,000 rows: the running queue's own writes never wait long for the lock.
    for start in range(0, count, 10_000):
        write(db, chunk(start, min(count, start + 10_000)))
    from nymph.queue.pgdb import is_url

    if is_url(db):
        # PostgreSQL's autovacuum analyzes a table within a minute of a change this large; a
        # queue whose backlog grew over time has those statistics, so the bench does not wait
        # for them. (SQLite has no such thing, and nymph never runs ANALYZE: none there.)
        write(db, lambda conn: conn.execute("ANALYZE tasks"))
        write(db, lambda conn: conn.execute("ANALYZE instances"))
    return time.perf_counter() - t0


# --- the queue process -------------------------------------------------------------------------

#: Every queue process started and not yet reaped (killed on any exit, see :func:`main`).
_PROCS: list[subprocess.Popen[str]] = []


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


@dataclass
class Queue:
    db: str
    url: str = ""
    user_token: str = ""
    daemon_token: str = ""
    proc: subprocess.Popen[str] | None = None
    _clients: list[QueueClient] = field(default_factory=list)

    def user(self, namespace: str = TEAM_A) -> QueueClient:
        c = QueueClient(base_url=self.url, token=self.user_token, namespace=namespace, timeout=60)
        self._clients.append(c)
        return c

    def daemon(self) -> QueueClient:
        c = QueueClient(base_url=self.url, token=self.daemon_token, timeout=60)
        self._clients.append(c)
        return c

    async def close(self) -> None:
        for c in self._clients:
            await c.close()
        if self.proc is not None:
            await asyncio.to_thread(_stop, self.proc)


@contextlib.asynccontextmanager
async def queue(db: str) -> Any:
    """A running queue on ``db`` with a user and a daemon token, and the bench's provider and
    mode in both namespaces; stopped at the end, pass or fail."""

    def tokens(conn: Conn) -> tuple[str, str]:
        return create_token(conn, role=Role.USER).token, create_token(conn, role=Role.DAEMON).token

    user_token, daemon_token = await asyncio.to_thread(write, db, tokens)
    q = Queue(db=db, user_token=user_token, daemon_token=daemon_token)
    serve = [sys.executable, "-m", "nymph.cli", "--log-level", "warning", "queue", "serve"]
    q.proc = await asyncio.to_thread(
        subprocess.Popen,
        [*serve, "--db", db, "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    _PROCS.append(q.proc)
    try:
        assert q.proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(q.proc.stdout.readline), 60)
        if "serving on " not in line:
            raise RuntimeError(f"nymph queue serve did not start: {line!r}")
        q.url = line.split("serving on ", 1)[1].split()[0]
        for ns in (TEAM_A, TEAM_B):
            user = q.user(ns)
            await user.create_provider(name="bench", kwargs={"namespace": "bench"}, dispatch="daemon")
            await user.create_mode(name="tiny", provider="bench", fields={"image": "busybox"})
        yield q
    finally:
        await q.close()


class Daemon:
    """One daemon on a CPU node: claims, and finishes what it claimed as a real one would (the
    apply completed, then the Pod's end reported), so nothing piles up in the running set."""

    def __init__(self, q: Queue, name: str = "bench-d1") -> None:
        self.client = q.daemon()
        self.name = name
        self.seq = 0

    async def claim(self, *, wait: float = 0) -> list[Any]:
        return list(
            await self.client.claim(
                daemon_id=self.name,
                node=CPU_NODE["name"],  # type: ignore[arg-type]
                capacity=1,
                wait=wait,
                lease_seconds=600,
                node_info=CPU_NODE,
            )
        )

    async def finish(self, tasks: list[Any]) -> None:
        for t in tasks:
            await self.client.complete(daemon_id=self.name, task_id=t["taskId"], ok=True)
            self.seq += 1
            report = {
                "seq": self.seq,
                "instanceId": t["instanceId"],
                "state": "stopped",
                "reason": "Completed",
                "node": CPU_NODE["name"],
            }
            await self.client.report(daemon_id=self.name, stream=f"{self.name}-boot", reports=[report])


async def launch(user: QueueClient, **fields: Any) -> str:
    accepted = await user.launch(provider="bench", mode="tiny", script="true", fields=fields or None)
    return str(accepted["instanceId"])


# --- the measurements ----------------------------------------------------------------------


def sampling(p: Params) -> Iterator[int]:
    """``p.samples`` rounds, or fewer (not below ``p.min_samples``) once ``p.sample_seconds`` passed."""
    t0 = time.monotonic()
    for k in range(p.samples):
        if k >= p.min_samples and time.monotonic() - t0 > p.sample_seconds:
            return
        yield k


async def backlog(db: str, size: int, p: Params, say: Callable[[str], None]) -> dict[str, Any]:
    async with queue(db) as q:
        user = q.user(TEAM_A)
        template = await launch(user)
        seed_s = await asyncio.to_thread(seed, db, template=template, count=size, tag=f"b{size}")
        say(f"  {size:,} queued (seeded in {seed_s:.1f}s)")
        d = Daemon(q)
        for _ in range(5):  # warm up both paths (the session, the caches), unmeasured
            await launch(user)
            await d.finish(await d.claim())
        post_ms: list[float] = []
        for _ in sampling(p):
            t0 = time.perf_counter()
            await launch(user)
            post_ms.append((time.perf_counter() - t0) * 1000)
        claim_ms: list[float] = []
        for _ in sampling(p):
            t0 = time.perf_counter()
            got = await d.claim()
            claim_ms.append((time.perf_counter() - t0) * 1000)
            assert len(got) == 1, got
            await d.finish(got)
        page_ms: list[float] = []
        waiting = ""
        for _ in range(p.page_samples):
            t0 = time.perf_counter()
            page = await user.instances_page(provider="bench", limit=500)
            page_ms.append((time.perf_counter() - t0) * 1000)
            queued = [i for i in page.items if i["state"] == "queued"]
            waiting = str(queued[-1].get("waiting") or "") if queued else ""
    return {
        "queued": size,
        "seed_seconds": round(seed_s, 2),
        "claim_ms": summary(claim_ms),
        "post_ms": summary(post_ms),
        "list_page_500_ms": summary(page_ms),
        "list_page_waiting_example": waiting,
    }


async def starvation(db: str, p: Params, say: Callable[[str], None]) -> dict[str, Any]:
    async with queue(db) as q:
        user = q.user(TEAM_A)
        template = await launch(user, **GPU_ONLY)
        seed_s = await asyncio.to_thread(seed, db, template=template, count=p.starvation_backlog, tag="gpu")
        say(f"  {p.starvation_backlog + 1:,} unrunnable queued (seeded in {seed_s:.1f}s)")
        d = Daemon(q)
        arrived: dict[str, float] = {}
        stop = asyncio.Event()
        claims: list[float] = []

        async def poll() -> None:
            while not stop.is_set():
                t0 = time.perf_counter()
                got = await d.claim(wait=10)
                claims.append((time.perf_counter() - t0) * 1000)
                now = time.perf_counter()
                for t in got:
                    arrived[str(t["instanceId"])] = now
                await d.finish(got)

        poller = asyncio.create_task(poll())
        try:
            await asyncio.sleep(1.0)  # the daemon holds its long-poll
            ms: list[float] = []
            for _ in range(p.starvation_samples):
                t0 = time.perf_counter()
                iid = await launch(user)
                while iid not in arrived:
                    if poller.done():
                        poller.result()
                    if time.perf_counter() - t0 > 60:
                        raise TimeoutError(f"the runnable launch {iid} was never handed out")
                    await asyncio.sleep(0.002)
                ms.append((arrived[iid] - t0) * 1000)
                await asyncio.sleep(0.2)  # the daemon finished it and holds a long-poll again
        finally:
            stop.set()
            poller.cancel()
            await asyncio.gather(poller, return_exceptions=True)
        # An empty claim on this backlog (what every daemon's re-poll costs).
        idle: list[float] = []
        for _ in range(min(p.samples, 50)):
            t0 = time.perf_counter()
            assert await d.claim() == []
            idle.append((time.perf_counter() - t0) * 1000)
    return {
        "unrunnable_queued": p.starvation_backlog + 1,
        "starvation_ms": summary(ms),
        "empty_claim_ms": summary(idle),
    }


async def share(db: str, p: Params, say: Callable[[str], None], *, pods_end: bool) -> dict[str, Any]:
    """One daemon of capacity 1 claims in a loop. ``pods_end``: each launch's Pod ends before
    the next claim (the apply completed, then stopped reported: nothing runs at a claim);
    else the apply is completed and the Pod keeps running (each team's running set grows)."""
    async with queue(db) as q:
        a, b = q.user(TEAM_A), q.user(TEAM_B)
        template = await launch(a)
        await asyncio.to_thread(seed, db, template=template, count=p.share_big - 1, tag="share")
        small = {await launch(b) for _ in range(p.share_small)}
        d = Daemon(q)
        started: dict[str, list[float]] = {TEAM_A: [], TEAM_B: []}
        order: list[str] = []
        t0 = time.perf_counter()
        while len(started[TEAM_B]) < len(small) or len(started[TEAM_A]) < p.share_small:
            got = await d.claim()
            now = (time.perf_counter() - t0) * 1000
            assert len(got) == 1, got
            ns = str(got[0]["namespace"])
            started[ns].append(now)
            order.append(ns)
            if pods_end:
                await d.finish(got)
            else:
                await d.client.complete(daemon_id=d.name, task_id=got[0]["taskId"], ok=True)
            if len(order) >= p.share_claim_cap:
                break  # the small team still waits: say so rather than drain the big backlog
        seconds = time.perf_counter() - t0
    b_ms, a_ms = started[TEAM_B], started[TEAM_A][: p.share_small]
    done = len(b_ms) == len(small)
    return {
        "big_queued": p.share_big,
        "small_queued": p.share_small,
        "small_started": len(b_ms),
        "small_started_ms": {"p50": pct(b_ms, 50), "max": round(max(b_ms), 2)} if done else None,
        "big_first_started_ms": {"p50": pct(a_ms, 50), "max": round(max(a_ms), 2)},
        "claims_until_small_done": _last(order, TEAM_B) + 1 if done else None,
        "claims": len(order),
        "seconds": round(seconds, 2),
    }


def _last(order: list[str], ns: str) -> int:
    return max(i for i, x in enumerate(order) if x == ns)


def _ratio(rows: dict[str, Any], what: str) -> float | None:
    sizes = sorted(int(k) for k in rows)
    if len(sizes) < 2:
        return None
    lo, hi = rows[str(sizes[0])][what]["p50"], rows[str(sizes[-1])][what]["p50"]
    return round(hi / lo, 2) if lo > 0 else None


async def bench_backend(new_db: Callable[[], str], p: Params, say: Callable[[str], None]) -> dict[str, Any]:
    out: dict[str, Any] = {"backlog": {}}
    for size in p.sizes:
        out["backlog"][str(size)] = await backlog(new_db(), size, p, say)
        row = out["backlog"][str(size)]
        say(
            f"  claim p50 {row['claim_ms']['p50']} ms, POST p50 {row['post_ms']['p50']} ms, "
            f"page of 500 p50 {row['list_page_500_ms']['p50']} ms"
        )
    out["claim_p50_ratio_100k_to_1k"] = _ratio(out["backlog"], "claim_ms")
    out["post_p50_ratio_100k_to_1k"] = _ratio(out["backlog"], "post_ms")
    out.update(await starvation(new_db(), p, say))
    say(f"  starvation p50 {out['starvation_ms']['p50']} ms")
    say(f"  fair share: {p.share_big:,} queued in {TEAM_A}, {p.share_small} in {TEAM_B}")
    out["share_10k_vs_10"] = {}
    for name, pods_end in (("pods_keep_running", False), ("pods_end_before_next_claim", True)):
        row = out["share_10k_vs_10"][name] = await share(new_db(), p, say, pods_end=pods_end)
        say(
            f"  {name}: {row['small_started']} of {TEAM_B}'s {p.share_small} started in {row['claims']} claims"
        )
    return out


@contextlib.contextmanager
def sqlite_dbs() -> Iterator[Callable[[], str]]:
    with tempfile.TemporaryDirectory(prefix="nymph-sched-bench-") as tmp:
        n = iter(range(10**6))
        yield lambda: str(Path(tmp) / f"queue-{next(n)}.db")


async def run(backends: list[str], p: Params) -> dict[str, Any]:
    """Every measurement on each backend: ``{backend: figures}`` (``{"skipped": why}`` when
    PostgreSQL is missing)."""
    started = time.time()

    def say(what: str) -> None:
        print(f"[{time.time() - started:6.1f}s] {what}", flush=True)

    out: dict[str, Any] = {}
    for backend in backends:
        say(backend)
        if backend == "sqlite":
            with sqlite_dbs() as new_db:
                out[backend] = await bench_backend(new_db, p, say)
            continue
        from tests.support.pg_server import PgUnavailable, running_server

        try:
            with running_server() as server:
                out[backend] = await bench_backend(lambda: server.fresh_database(migrated=True), p, say)
        except PgUnavailable as exc:
            out[backend] = {"skipped": str(exc)}
            say(f"  skipped: {exc}")
    out["seconds"] = round(time.time() - started, 1)
    return out


def merge(path: Path, figures: dict[str, Any], p: Params) -> dict[str, Any]:
    """``path``'s document with ``scheduling`` updated by these backends' figures (its other
    keys and other backends kept)."""
    doc: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    section = dict(doc.get("scheduling") or {})
    section.update({k: v for k, v in figures.items() if k != "seconds"})
    section["when"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    section["params"] = {k: list(v) if isinstance(v, tuple) else v for k, v in vars(p).items()}
    section["seconds"] = figures["seconds"]
    section["cpus"] = os.cpu_count()
    doc["scheduling"] = section
    return doc


def table(section: dict[str, Any]) -> str:
    lines = []
    for backend in ("sqlite", "postgresql"):
        r = section.get(backend)
        if not r:
            continue
        if "skipped" in r:
            lines.append(f"[{backend}] skipped: {r['skipped']}")
            continue
        lines.append(f"[{backend}]")
        for size, row in r["backlog"].items():
            lines.append(
                f"  {int(size):>7,} queued: claim p50 {row['claim_ms']['p50']:>7} p95 {row['claim_ms']['p95']:>7} ms"
                f" | POST p50 {row['post_ms']['p50']:>7} p95 {row['post_ms']['p95']:>7} ms"
                f" | page of 500 p50 {row['list_page_500_ms']['p50']:>8} ms"
            )
        lines.append(
            f"  claim p50 ratio {r['claim_p50_ratio_100k_to_1k']}, POST p50 ratio {r['post_p50_ratio_100k_to_1k']}"
            " (largest backlog to smallest; target <= 1.5)"
        )
        s = r["starvation_ms"]
        lines.append(
            f"  starvation ({r['unrunnable_queued']:,} unrunnable): POST -> claimed p50 {s['p50']} ms, max {s['max']} ms"
        )
        for name, sh in r["share_10k_vs_10"].items():
            small = sh["small_started_ms"]
            when = (
                f"p50 {small['p50']} ms, max {small['max']} ms (claim {sh['claims_until_small_done']})"
                if small
                else f"{sh['small_started']} of them in {sh['claims']} claims ({sh['seconds']} s)"
            )
            lines.append(
                f"  share ({sh['big_queued']:,} vs {sh['small_queued']}, {name}): small started {when}; "
                f"big's first {sh['small_queued']} p50 {sh['big_first_started_ms']['p50']} ms"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--quick", action="store_true", help="small backlogs and few samples (a smoke run)")
    parser.add_argument("--out", type=Path, default=REPO / "bench-results.json")
    args = parser.parse_args(argv)
    p = QUICK if args.quick else Params()
    backends = ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]
    configure_logging(level="warning")
    try:
        figures = asyncio.run(run(backends, p))
    finally:
        for proc in list(_PROCS):
            _stop(proc)
    doc = merge(args.out, figures, p)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(table(figures))
    print(f"written to {args.out} (under scheduling)")
    return 0


if __name__ == "__main__":
    sigterm.unwind_on_sigterm()
    sys.exit(main())
