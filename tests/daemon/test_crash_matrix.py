"""Crash matrix: launches with random stops while the daemon, the queue and the API server die.

``NYMPH_FAULT_LAUNCHES`` launches (default 60: every fault below still meets launches in flight,
and ``make test`` stays short; ``make faults`` runs 200) are queued at a steady pace (a few
seconds of simulated run each, some failing, one in five stopped at a random moment) while a
schedule of faults runs: the daemon is killed with SIGKILL at each stage of a launch,
``NYMPH_FAULT_ROUNDS`` times over (1 in ``make test``, 2 in ``make faults``), and restarted each
time; the queue is killed and restarted once; the API server is stopped once, for
``NYMPH_FAULT_OUTAGE`` seconds (8 in ``make test``: longer than the daemon's first backoffs and
its watch's reconnect; 20 in ``make faults``). A stage is seen from outside (the only honest view of a kill -9): a task the queue's
database shows leased, a new claim line in the audit log, a new workdir, a kubectl child of the
daemon, a new apply line in the audit log, a stop task leased, a new reap line in the audit log.

The queue keeps its state where ``NYMPH_FAULT_BACKEND`` says (tests/support/fault_db.py): a
SQLite file (the default, ``make test``), or a fresh PostgreSQL database one proxied round trip
away (``pg``: ``NYMPH_PG_DELAY_MS`` each way, default 1), or both in turn (``sqlite,pg``, ``make
faults``). On PostgreSQL the server is also stopped and started again once mid-run (for
``DB_OUTAGE`` seconds): meanwhile the queue must answer 503 ``database_unavailable``, and after
it everything goes on.

At the end every accepted launch must have ended, with exactly one Pod ever created (counted by
UID with the test's own watch) unless it was stopped before its Pod existed; every instance's
final state must match what the cluster did; every restart must have succeeded; the audit log
must verify; after the reaper no workdir and no Pod may be left; and no token or credential may
be found in what the crashed processes wrote.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

from nymph.client import QueueClient
from nymph.localcluster import LocalCluster
from tests.support.fault_db import backends, fault_db
from tests.support.harness import pods
from tests.support.kube_faults import PodRecord, PodWatch, start_apiserver, stop_apiserver
from tests.support.leaks import kubeconfig_secrets, scan_files
from tests.support.stack import FaultStack, running_stack
from tests.support.tally import TALLY

pytestmark = [pytest.mark.faults, pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

LAUNCHES = int(os.environ.get("NYMPH_FAULT_LAUNCHES", "60"))
STAGES = ("claimed", "audited", "workdir", "kubectl", "applied", "stopping", "reaping")
ROUNDS = int(os.environ.get("NYMPH_FAULT_ROUNDS", "1"))
IN_FLIGHT = 16  # launches kept unfinished at once by the load
STAGE_TIMEOUT = 20.0
OUTAGE_SECONDS = float(os.environ.get("NYMPH_FAULT_OUTAGE", "8"))
FINISHED = {"stopped"}
DB_OUTAGE = 3.0  # seconds the PostgreSQL server stays down


@dataclass
class Plan:
    outcome: str  # succeed | fail
    run: str
    stop_after: float | None  # seconds after acceptance, or None


@dataclass
class Run:
    stack: FaultStack
    rng: random.Random
    accepted: dict[str, Plan] = field(default_factory=dict)
    stop_requested: set[str] = field(default_factory=set)
    states: dict[str, dict] = field(default_factory=dict)  # type: ignore[type-arg]
    stage_hits: dict[str, int] = field(default_factory=dict)
    stage_misses: dict[str, int] = field(default_factory=dict)
    daemon_died: list[str] = field(default_factory=list)
    #: What the queue answered while its database was down, when that was not a 503.
    db_down_answers: list[str] = field(default_factory=list)
    done_loading: bool = False
    outage: bool = False

    def client(self) -> QueueClient:
        return QueueClient(base_url=self.stack.queue.url, token=self.stack.queue.user_token, timeout=10)

    def unfinished(self) -> list[str]:
        return [i for i in self.accepted if (self.states.get(i) or {}).get("state") not in FINISHED]

    async def submit(self, plan: Plan) -> str:
        key = uuid.uuid4().hex
        tags = {"sim.nymph.io/run": plan.run}
        if plan.outcome == "fail":
            tags["sim.nymph.io/outcome"] = "fail"
        deadline = time.monotonic() + 120
        while True:  # the queue may be down: re-send with the same key, as a client would
            try:
                async with self.client() as c:
                    iid = str(
                        (
                            await c.launch(
                                provider="local",
                                mode="py",
                                script="print('x')\n",
                                tags=tags,
                                idempotency_key=key,
                            )
                        )["instanceId"]
                    )
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
        self.accepted[iid] = plan
        TALLY.launches += 1
        if plan.stop_after is not None:
            asyncio.get_running_loop().create_task(self.stop_later(iid, plan.stop_after))
        return iid

    async def stop(self, iid: str) -> None:
        self.stop_requested.add(iid)
        deadline = time.monotonic() + 120
        while True:
            try:
                async with self.client() as c:
                    await c.stop(provider="local", instance_id=iid)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)

    async def stop_later(self, iid: str, delay: float) -> None:
        await asyncio.sleep(delay)
        if (self.states.get(iid) or {}).get("state") not in FINISHED:
            await self.stop(iid)

    def random_plan(self) -> Plan:
        r = self.rng
        return Plan(
            outcome="fail" if r.random() < 0.1 else "succeed",
            run=r.choice(["1s", "2s", "3s"]),
            stop_after=r.uniform(0.0, 4.0) if r.random() < 0.2 else None,
        )

    async def poll_states(self) -> None:
        while True:
            try:
                async with self.client() as c:
                    for inst in await c.list_instances(provider="local"):
                        self.states[inst["instanceId"]] = dict(inst)
            except Exception:
                pass
            await asyncio.sleep(0.5)

    async def load(self, count: int) -> None:
        for _ in range(count):
            # No new launches while the API server is down: those in flight meet the outage, and
            # the rest of the budget goes to the crash stages rather than to a 20 s stall.
            while len(self.unfinished()) >= IN_FLIGHT or self.outage:  # noqa: ASYNC110 - polls state outside this process
                await asyncio.sleep(0.1)
            await self.submit(self.random_plan())
        self.done_loading = True

    # -- faults ------------------------------------------------------------------------------

    async def until(self, stage: str, cond: Callable[[], bool]) -> None:
        deadline = time.monotonic() + STAGE_TIMEOUT
        while time.monotonic() < deadline:
            if cond():
                self.stage_hits[stage] = self.stage_hits.get(stage, 0) + 1
                return
            await asyncio.sleep(0.01)
        self.stage_misses[stage] = self.stage_misses.get(stage, 0) + 1

    async def kill_at(self, stage: str) -> None:
        s = self.stack
        if s.daemon.proc is not None and s.daemon.proc.poll() is not None:
            self.daemon_died.append(f"before the {stage} kill: exit {s.daemon.proc.returncode}")
        if stage == "claimed":
            before = s.leased("launch")
            await self.submit(Plan("succeed", "1s", None))
            await self.until(stage, lambda: bool(s.leased("launch") - before))
        elif stage == "audited":
            n = s.audit_count("claim")
            await self.submit(Plan("succeed", "1s", None))
            await self.until(stage, lambda: s.audit_count("claim") > n)
        elif stage == "workdir":
            before = s.workdirs()
            await self.submit(Plan("succeed", "1s", None))
            await self.until(stage, lambda: bool(s.workdirs() - before))
        elif stage == "kubectl":
            await self.submit(Plan("succeed", "1s", None))
            await self.until(stage, lambda: bool(s.kubectl_children()))
        elif stage == "applied":
            n = s.audit_count("apply", "ok")
            await self.submit(Plan("succeed", "1s", None))
            await self.until(stage, lambda: s.audit_count("apply", "ok") > n)
        elif stage == "stopping":
            iid = await self.submit(Plan("succeed", "60s", None))
            deadline = time.monotonic() + STAGE_TIMEOUT
            while (self.states.get(iid) or {}).get("state") != "running" and time.monotonic() < deadline:  # noqa: ASYNC110 - polls state outside this process
                await asyncio.sleep(0.05)
            await self.stop(iid)
            await self.until(stage, lambda: bool(s.leased("stop")) or bool(s.kubectl_children()))
        elif stage == "reaping":
            n = s.audit_count("reap")
            await self.until(stage, lambda: s.audit_count("reap") > n)
        await asyncio.to_thread(s.kill_daemon)
        await asyncio.sleep(self.rng.uniform(0.0, 0.5))
        await asyncio.to_thread(s.restart_daemon)

    async def queue_crash(self) -> None:
        await asyncio.to_thread(self.stack.kill_queue)
        await asyncio.sleep(2.0)
        await asyncio.to_thread(self.stack.restart_queue)

    async def apiserver_outage(self) -> None:
        s = self.stack
        self.outage = True
        await asyncio.to_thread(stop_apiserver, s.kube)
        TALLY.kills += 1
        await asyncio.sleep(OUTAGE_SECONDS)
        s.restarts += 1
        try:
            await asyncio.to_thread(start_apiserver, s.kube)
        except AssertionError as exc:
            TALLY.restarts_failed += 1
            s.failed_restarts.append(f"kube-apiserver: {exc}")
        self.outage = False
        if s.daemon.proc is not None and s.daemon.proc.poll() is not None:
            self.daemon_died.append(f"during the API server outage: exit {s.daemon.proc.returncode}")
            await asyncio.to_thread(s.restart_daemon)

    async def database_restart(self) -> None:
        """Stop the PostgreSQL server under the running queue and daemon, check the queue
        answers 503 meanwhile, and start it again."""
        s = self.stack
        await asyncio.to_thread(s.stop_database)
        try:
            url = f"{s.queue.url}/v1/namespaces/default/providers/local/instances"
            headers = {"Authorization": f"Bearer {s.queue.user_token}"}
            timeout = aiohttp.ClientTimeout(total=10)
            try:
                async with (
                    aiohttp.ClientSession(timeout=timeout) as http,
                    http.get(url, headers=headers) as resp,
                ):
                    body = await resp.text()
                if resp.status != 503 or "database_unavailable" not in body:
                    self.db_down_answers.append(f"{resp.status} {body[:200]}")
            except (aiohttp.ClientError, TimeoutError) as exc:
                self.db_down_answers.append(f"no answer: {exc!r}")
            await asyncio.sleep(DB_OUTAGE)
        finally:
            await asyncio.to_thread(s.start_database)

    async def faults(self) -> None:
        for rnd in range(ROUNDS):
            for stage in STAGES:
                await self.kill_at(stage)
                if rnd == 0 and stage == "audited" and self.stack.db.server is not None:
                    await self.database_restart()
                if rnd == 0 and stage == "kubectl":
                    await self.queue_crash()
                if rnd == 0 and stage == "applied":
                    await self.apiserver_outage()


@pytest.fixture(params=backends())
def stack(
    kube: LocalCluster, namespace: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[FaultStack]:
    with fault_db(request.param, tmp_path, lambda: request.getfixturevalue("pg_server")) as db:
        yield from running_stack(kube, namespace, tmp_path, db=db, extra=("--reap-after", "2"))


async def test_crash_matrix(stack: FaultStack) -> None:
    started, kills = time.monotonic(), TALLY.kills
    run = Run(stack=stack, rng=random.Random(int(os.environ.get("NYMPH_FAULT_SEED", "11"))))
    injector_launches = ROUNDS * (len(STAGES) - 1)
    with PodWatch(stack.kube, stack.namespace) as watch:
        poller = asyncio.create_task(run.poll_states())
        try:
            load = asyncio.create_task(run.load(max(0, LAUNCHES - injector_launches)))
            await run.faults()
            await load
            deadline = time.monotonic() + 240
            while run.unfinished() and time.monotonic() < deadline:  # noqa: ASYNC110 - polls state outside this process
                await asyncio.sleep(0.5)
            # After the reaper (2 s after each Pod ends): no Pod and no workdir may be left.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and (pods(stack.kube, stack.namespace) or stack.workdirs()):  # noqa: ASYNC110 - polls state outside this process
                await asyncio.sleep(0.5)
            await asyncio.sleep(1.0)  # let the watch see the last deletions
        finally:
            poller.cancel()
        seen = watch.snapshot()
    check(run, stack, seen, reconnects=watch.reconnects, kills=TALLY.kills - kills, started=started)


def check(run: Run, stack: FaultStack, seen: dict, *, reconnects: int, kills: int, started: float) -> None:  # type: ignore[type-arg]
    problems: list[str] = []
    lost: list[str] = []
    duplicated = sorted(name for name, rec in seen.items() if len(rec.uids) > 1)
    for iid, plan in run.accepted.items():
        inst = run.states.get(iid)
        if inst is None or inst["state"] not in FINISHED:
            lost.append(f"{iid}: still {inst and inst['state']}")
            continue
        rec = seen.get(iid)
        reason = inst["reason"]
        stopped = iid in run.stop_requested
        if reason in ("Completed", "Error"):
            want_phase = "Succeeded" if reason == "Completed" else "Failed"
            if rec is None:
                lost.append(f"{iid}: {reason} but no Pod was ever created")
            elif rec.phase != want_phase:
                problems.append(f"{iid}: {reason} but its Pod's last phase was {rec.phase!r}")
            if not stopped and reason != {"succeed": "Completed", "fail": "Error"}[plan.outcome]:
                problems.append(f"{iid}: planned to {plan.outcome}, ended {reason}")
        elif reason == "Stopped":
            if not stopped:
                problems.append(f"{iid}: Stopped without a stop request")
            if rec is not None and not rec.deleted:
                problems.append(f"{iid}: Stopped but its Pod was never deleted")
        else:
            problems.append(f"{iid}: ended {reason}: {inst.get('message')!r}")
    strangers = sorted(set(seen) - set(run.accepted))
    if strangers:
        problems.append(f"Pods of no accepted launch: {strangers[:10]}")
    left_pods = [p["metadata"]["name"] for p in pods(stack.kube, stack.namespace)]
    left_dirs = sorted(stack.workdirs())
    verify = stack.audit_verify()
    # The crashes left logs, state and audit records written in every odd moment: no secret there.
    planted = {"user token": stack.queue.user_token, "daemon token": stack.queue.daemon_token}
    planted |= {
        f"daemon kubeconfig credential {i}": v
        for i, v in enumerate(kubeconfig_secrets(stack.daemon.kubeconfig))
    }
    roots = [stack.tmp, *stack.db.secret_roots()]
    leaks = scan_files(roots, planted, skip={stack.daemon.kubeconfig.resolve()})
    TALLY.secret_leaks += len(leaks)
    TALLY.lost += len(lost)
    TALLY.duplicated += len(duplicated)
    figure = TALLY.figure(
        f"crash matrix on {stack.db.label}",
        launches=len(run.accepted),
        kills=kills,
        lost=len(lost),
        duplicated=len(duplicated),
        seconds=time.monotonic() - started,
    )
    report = (
        f"{figure}; restarts {stack.restarts}, stage kills seen {run.stage_hits}, "
        f"stage kills that did not see their stage in {STAGE_TIMEOUT:g}s {run.stage_misses}, "
        f"watch reconnects {reconnects}"
    )
    print(report)
    failures = [f"restart failed: {f}" for f in stack.failed_restarts]
    failures += [f"the daemon died {d}" for d in run.daemon_died]
    failures += [f"with its database down the queue answered {a}" for a in run.db_down_answers]
    failures += [f"lost: {x}" for x in lost]
    failures += [f"applied twice (Pods {sorted(seen[n].uids)}): {n}" for n in duplicated]
    failures += problems
    detail = [history(run, f) + traces(stack, f) + cluster_traces(stack, seen, f) for f in [*lost, *problems]]
    if verify.returncode != 0:
        failures.append(f"audit verify: {(verify.stdout + verify.stderr).strip()[-600:]}")
    if left_pods:
        failures.append(f"Pods left after the reaper: {left_pods[:20]}")
    if left_dirs:
        failures.append(f"workdirs left after the reaper: {left_dirs[:20]}")
    failures += [f"secret leaked: {leak}" for leak in leaks]
    if len(run.accepted) < LAUNCHES:
        failures.append(f"only {len(run.accepted)} of {LAUNCHES} launches were run")
    assert not failures, (
        f"{len(failures)} failures ({report}):\n"
        + "\n".join(grouped(failures))
        + "\nwhat the queue recorded of them:\n"
        + "\n".join(d for d in detail if d)
    )


def history(run: Run, failure: str) -> str:
    """The instance a failure names: its planned fate and the queue's history of it."""
    found = re.search(r"lakeshore-[0-9a-f]{8}", failure)
    if found is None:
        return ""
    iid = found.group(0)
    plan = run.accepted.get(iid)
    steps = [
        f"{h.get('state')}/{h.get('reason')}: {str(h.get('message'))[:80]}"
        for h in (run.states.get(iid) or {}).get("history") or []
    ]
    stop = "stop requested" if iid in run.stop_requested else "no stop"
    return f"  {iid} ({plan and plan.outcome}, {stop}): " + " -> ".join(steps)


def traces(stack: FaultStack, failure: str) -> str:
    """What the daemons audited and logged of the instance a failure names (to tell who did what)."""
    found = re.search(r"lakeshore-[0-9a-f]{8}", failure)
    if found is None:
        return ""
    iid = found.group(0)
    audited = [
        f"{r.get('action')}/{r.get('result')}@{str(r.get('ts'))[11:23]}"
        for r in stack.audit_records()
        if r.get("instance") == iid
    ]
    logged = [line[:300] for line in stack.daemon_log().splitlines() if iid in line][-8:]
    return "\n    audit: " + " ".join(audited) + "".join(f"\n    log: {line}" for line in logged)


def cluster_traces(stack: FaultStack, seen: dict[str, PodRecord], failure: str) -> str:
    """What the cluster did to the Pod a failure names: the test's own watch of it, and the
    control-plane lines that name it (a controller that deleted it says so)."""
    found = re.search(r"lakeshore-[0-9a-f]{8}", failure)
    if found is None:
        return ""
    iid = found.group(0)
    rec = seen.get(iid)
    lines = [f"\n    pod: {e}" for e in (rec.events if rec is not None else [])]
    for proc in stack.kube.procs:
        named = [line[:300] for line in proc.tail(2_000_000).splitlines() if iid in line][-4:]
        lines += [f"\n    {proc.name}: {line}" for line in named]
    return "".join(lines)


def grouped(failures: list[str]) -> list[str]:
    """One line per kind of failure (ids, ports and numbers masked), with its count and examples."""
    kinds: dict[str, list[str]] = {}
    for f in failures:
        key = re.sub(r"lakeshore-[0-9a-f]{8}|127\.0\.0\.1:\d+|\d+", "#", f)[:240]
        kinds.setdefault(key, []).append(f)
    return [
        f"{len(v)} x {k} (first: {v[0][:300]})" for k, v in sorted(kinds.items(), key=lambda kv: -len(kv[1]))
    ]
