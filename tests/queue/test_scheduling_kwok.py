"""The scheduler end to end on the real API server: two kwok nodes (``pool=cpu`` with 4 cpu and
no taint; ``pool=big`` with 16 cpu and a ``dedicated=big:NoSchedule`` taint), one real
``nymph daemon`` process per node (each sending its own node's offer), a real queue process
(SQLite), and three teams whose settings an admin sets with ``nymph quota set`` (team-a weight
2, team-b weight 1, team-c weight 1 with maxRunning 3). The teams queue 300 launches between
them before any daemon runs, mixed: pinned to one pool or not, tolerating the taint or not,
with and without cpu requests, at three priorities.

It guards that under that load every launch is handed out and completes; none runs on a node
it does not fit (selector, taint, requests; never more cpu placed on a node than it offers,
and no Pod turns Unschedulable); team-c's quota holds (never more than 3 running, by the
queue's own usage and by the instances' histories, and it does reach 3); and while every team
still has launches waiting that either node may take, the running launches are shared as the
weights say: each team's share of the running launches, averaged over that time, is within 10
percentage points of its entitlement, the weighted max-min split of what ran at each moment
with team-c held at its cap (see :func:`entitled` and :func:`_check_shares`).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from nymph.client import QueueClient
from nymph.errors import NymphError
from nymph.localcluster import LocalCluster
from nymph.protocol import parse_iso
from tests.support.harness import DaemonProc, QueueProc, daemon_kubeconfig, nymph, pods, running
from tests.support.kwok_nodes import kwok_nodes, node_manifest, node_reader

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

WEIGHTS = {"team-a": 2, "team-b": 1, "team-c": 1}
CAPS = {"team-c": 3}
#: team-c, capped at 3 running, gets fewer launches so that it is not the last team by far.
COUNTS = {"team-a": 130, "team-b": 100, "team-c": 70}
CAPACITY = 10  # each daemon's --concurrency
PRIORITIES = (0, 5, -5)
RUN = {"sim.nymph.io/run": "1s"}
BIG_TAINT = {"key": "dedicated", "value": "big", "effect": "NoSchedule"}
TOLERATE_BIG = [{"key": "dedicated", "operator": "Equal", "value": "big", "effect": "NoSchedule"}]
NODES = {
    "cpu": {"labels": {"pool": "cpu"}, "taints": [], "alloc": {"cpu": "4", "memory": "8Gi"}},
    "big": {"labels": {"pool": "big"}, "taints": [BIG_TAINT], "alloc": {"cpu": "16", "memory": "64Gi"}},
}
#: Often enough for 20 samples in the shortest window a fast run leaves (about 4 s).
SAMPLE_EVERY = 0.1
BACKLOG_EVERY = 0.5
TOLERANCE = 0.10


@dataclass(frozen=True)
class Kind:
    fields: dict[str, Any]
    #: The pool it may run on: one of NODES, or None for either.
    pool: str | None
    cpu: Fraction


KINDS = (
    Kind(
        {"node_selector": {"pool": "cpu"}, "resources": {"requests": {"cpu": "500m"}}}, "cpu", Fraction(1, 2)
    ),
    Kind(
        {
            "node_selector": {"pool": "big"},
            "tolerations": TOLERATE_BIG,
            "resources": {"requests": {"cpu": "1"}},
        },
        "big",
        Fraction(1),
    ),
    Kind(
        {"tolerations": TOLERATE_BIG, "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}}},
        None,
        Fraction(1, 4),
    ),
    Kind({"resources": {"requests": {"cpu": "250m"}}}, "cpu", Fraction(1, 4)),  # the taint keeps it off big
    Kind({"tolerations": TOLERATE_BIG}, None, Fraction(0)),
)


@dataclass(frozen=True)
class Run:
    team: str
    kind: Kind
    node: str
    start: float  # queue time of its first state past queued
    stop: float  # queue time of its stopped


def entitled(total: float, weights: Mapping[str, float], caps: Mapping[str, float]) -> dict[str, float]:
    """The weighted max-min split of ``total`` running launches between teams that all have
    work waiting: each team gets ``total`` times its weight over the weights of the teams still
    splitting, except that a team whose part would pass its cap gets the cap, and the rest is
    split again among the others (water-filling)."""
    out: dict[str, float] = {}
    left, active = total, set(weights)
    while active:
        per_weight = left / sum(weights[t] for t in active)
        capped = {t for t in active if t in caps and caps[t] < per_weight * weights[t]}
        if not capped:
            out.update({t: per_weight * weights[t] for t in active})
            break
        for t in capped:
            out[t] = caps[t]
            left -= caps[t]
        active -= capped
    return out


def most_at_once(intervals: Sequence[tuple[float, float, Fraction]]) -> Fraction:
    """The largest sum of weights of intervals ``(start, stop, weight)`` open at one instant (a
    stop at the instant another starts closes first)."""
    events = sorted([(s, 1, w) for s, _, w in intervals] + [(e, 0, -w) for _, e, w in intervals])
    cur = best = Fraction(0)
    for _, _, w in events:
        cur += w
        best = max(best, cur)
    return best


async def test_three_teams_share_two_nodes(kube: LocalCluster, namespace: str) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="nymph-share-"))
    tag = secrets.token_hex(3)
    names = {pool: f"{pool}-{tag}" for pool in NODES}
    passed = False
    try:
        manifests = [node_manifest(names[p], **spec) for p, spec in NODES.items()]
        with kwok_nodes(kube, manifests), node_reader(kube, namespace):
            kc = daemon_kubeconfig(kube, namespace, tmp)
            q = QueueProc(tmp / "q.db")
            q.tokens()
            admin_token = _token(q, "admin")
            q.start()
            daemons = [
                DaemonProc(q, kc, namespace, tmp / node, node=node, extra=("--concurrency", str(CAPACITY)))
                for node in names.values()
            ]
            with running(q, *daemons):
                await _setup_teams(q, namespace)
                _set_quotas(q, admin_token)
                launched = await _submit(q)
                samples: list[tuple[float, dict[str, int]]] = []
                backlogs: list[tuple[float, dict[str, set[str]]]] = []
                async with QueueClient(base_url=q.url, token=admin_token) as admin:
                    samplers = [
                        asyncio.create_task(_sample(admin, samples), name="test-usage-sampler"),
                        asyncio.create_task(_sample_backlogs(admin, backlogs), name="test-backlog-sampler"),
                    ]
                    try:
                        t0 = time.monotonic()
                        await asyncio.gather(*(asyncio.to_thread(d.start) for d in daemons))
                        done = await _all_stopped(q, set(launched), timeout=150)
                        drained = time.monotonic() - t0
                    finally:
                        for task in samplers:
                            task.cancel()
                        await asyncio.gather(*samplers, return_exceptions=True)
                pod_nodes = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in pods(kube, namespace)}
        runs = _check_runs(done, launched, pod_nodes, names)
        _check_quota(runs, samples)
        _check_shares(runs, samples, _both_pools_waiting(backlogs, launched), drained)
        passed = True
    finally:
        if not passed:
            _print_logs(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        with contextlib.suppress(NymphError):
            kube.api("DELETE", f"/api/v1/namespaces/{namespace}")


def _token(q: QueueProc, role: str) -> str:
    out = nymph("queue", "token", "create", "--db", str(q.db), "--role", role, check=True).stdout
    return out.strip().splitlines()[-1].split()[-1]


async def _setup_teams(q: QueueProc, kube_namespace: str) -> None:
    async with q.client() as c:
        for team in WEIGHTS:
            await c.create_provider(
                name="local",
                launcher="Kube",
                kwargs={"namespace": kube_namespace},
                dispatch="daemon",
                namespace=team,
            )
            await c.create_mode(
                name="py", provider="local", fields={"image": "python:3.12-slim"}, namespace=team
            )


def _set_quotas(q: QueueProc, admin_token: str) -> None:
    env = {"NYMPH_URL": q.url, "NYMPH_TOKEN": admin_token}
    for team, weight in WEIGHTS.items():
        extra = ("--max-running", str(CAPS[team])) if team in CAPS else ()
        done = nymph("quota", "set", team, "--weight", str(weight), *extra, env=env)
        assert done.returncode == 0, done.stderr


async def _submit(q: QueueProc) -> dict[str, tuple[str, Kind]]:
    """Queue every team's launches, interleaved, each team cycling through the kinds and the
    priorities; returns instance id -> (team, kind)."""
    order = [(team, i) for i in range(max(COUNTS.values())) for team in WEIGHTS if i < COUNTS[team]]
    out: dict[str, tuple[str, Kind]] = {}
    async with q.client() as c:

        async def one(team: str, i: int) -> None:
            kind = KINDS[i % len(KINDS)]
            accepted = await c.launch(
                provider="local",
                mode="py",
                script="print('hi')\n",
                tags=RUN,
                fields=kind.fields,
                priority=PRIORITIES[(i // len(KINDS)) % len(PRIORITIES)],
                namespace=team,
            )
            out[str(accepted["instanceId"])] = (team, kind)

        for start in range(0, len(order), 8):
            await asyncio.gather(*(one(team, i) for team, i in order[start : start + 8]))
    assert len(out) == sum(COUNTS.values()) == 300
    return out


async def _sample(admin: QueueClient, samples: list[tuple[float, dict[str, int]]]) -> None:
    """Every SAMPLE_EVERY seconds, what each team holds running by the queue's own count (the
    admin's ``GET /v1/quotas``, one read of every team's usage), stamped with the wall clock."""
    while True:
        before = time.time()
        items = await admin.list_quotas()
        stamp = (before + time.time()) / 2
        samples.append((stamp, {i["namespace"]: int(i["usage"]["running"]) for i in items}))
        await asyncio.sleep(SAMPLE_EVERY)


async def _sample_backlogs(admin: QueueClient, backlogs: list[tuple[float, dict[str, set[str]]]]) -> None:
    """Every BACKLOG_EVERY seconds, the launches each team has waiting in the queue's backlog:
    its queued instances that say why they wait (a leased one, on its way to a Pod, says
    nothing), stamped with the wall clock at the start of the reads."""
    while True:
        stamp = time.time()
        now: dict[str, set[str]] = {}
        for team in WEIGHTS:
            queued = await admin.list_instances(provider="local", state="queued", namespace=team)
            now[team] = {i["instanceId"] for i in queued if i.get("waiting")}
        backlogs.append((stamp, now))
        await asyncio.sleep(BACKLOG_EVERY)


async def _all_stopped(q: QueueProc, ids: set[str], *, timeout: float) -> dict[str, dict[str, Any]]:
    deadline = time.monotonic() + timeout
    async with q.client() as c:
        while True:
            items: dict[str, dict[str, Any]] = {}
            for team in WEIGHTS:
                items.update(
                    {
                        i["instanceId"]: dict(i)
                        for i in await c.list_instances(provider="local", namespace=team)
                    }
                )
            unsched = [i for i in items.values() if any(h["reason"] == "Unschedulable" for h in i["history"])]
            assert not unsched, unsched[0]
            left = [iid for iid in ids if items.get(iid, {}).get("state") != "stopped"]
            if not left:
                return {iid: items[iid] for iid in ids}
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{len(left)} of {len(ids)} launches not stopped in {timeout}s: {[items.get(i) for i in left[:3]]}"
                )
            await asyncio.sleep(1.0)


def _check_runs(
    done: Mapping[str, Mapping[str, Any]],
    launched: Mapping[str, tuple[str, Kind]],
    pod_nodes: Mapping[str, str | None],
    names: Mapping[str, str],
) -> list[Run]:
    """Every launch completed on a node it fits; never more cpu placed on a node than it offers."""
    pool_of = {node: pool for pool, node in names.items()}
    runs: list[Run] = []
    for iid, inst in done.items():
        team, kind = launched[iid]
        assert inst["reason"] == "Completed", inst
        node = inst["node"]
        assert node in pool_of, (iid, node)
        assert pod_nodes.get(iid) == node, (iid, pod_nodes.get(iid), node)
        spec = NODES[pool_of[node]]
        assert all(spec["labels"].get(k) == v for k, v in kind.fields.get("node_selector", {}).items()), (
            iid,
            node,
        )
        if spec["taints"]:
            assert kind.fields.get("tolerations") == TOLERATE_BIG, (iid, node)
        if kind.pool is not None:
            assert pool_of[node] == kind.pool, (iid, node, kind.pool)
        history = inst["history"]
        start = next(parse_iso(h["at"]) for h in history if h["state"] != "queued")
        stop = next(parse_iso(h["at"]) for h in history if h["state"] == "stopped")
        runs.append(Run(team=team, kind=kind, node=node, start=start, stop=stop))
    for pool, node in names.items():
        on_node = [(r.start, r.stop, r.kind.cpu) for r in runs if r.node == node]
        assert on_node, f"nothing ran on {node}"
        assert most_at_once(on_node) <= Fraction(NODES[pool]["alloc"]["cpu"]), (node, most_at_once(on_node))
    return runs


def _check_quota(runs: Sequence[Run], samples: Sequence[tuple[float, dict[str, int]]]) -> None:
    cap = CAPS["team-c"]
    sampled = max(s.get("team-c", 0) for _, s in samples)
    by_history = most_at_once([(r.start, r.stop, Fraction(1)) for r in runs if r.team == "team-c"])
    print(f"team-c running at most: {sampled} (sampled usage), {by_history} (histories); cap {cap}")
    assert sampled <= cap
    assert by_history <= cap
    assert sampled == cap  # the cap was reached, so it was what held team-c back


def _both_pools_waiting(
    backlogs: Sequence[tuple[float, Mapping[str, set[str]]]], launched: Mapping[str, tuple[str, Kind]]
) -> float:
    """Until when every team had, for each pool, a launch waiting that the pool's node may take
    (by selector and taint): the last backlog sample before one where some team had none. Past
    it a team's share is bounded by where its remaining launches may run, not by its weight."""
    last = backlogs[0][0]
    for stamp, waiting in backlogs:
        for team in WEIGHTS:
            pools = {launched[iid][1].pool for iid in waiting[team]}
            if None not in pools and not set(NODES) <= pools:
                return last
        last = stamp
    return last


def _check_shares(
    runs: Sequence[Run],
    samples: Sequence[tuple[float, dict[str, int]]],
    end: float,
    drained: float,
) -> None:
    """While all three teams had work waiting for both nodes (from when both daemons had started
    a launch until :func:`_both_pools_waiting`), the time-averaged share of each team in the
    running launches against the time-averaged entitlement (:func:`entitled` of the total
    running at each sample). Summing the counts over the samples first, then dividing, keeps a
    moment with few launches running from weighing as much as a busy one, and a team's one
    launch more or less at one moment from counting as a large error."""
    begin = max(min(r.start for r in runs if r.node == node) for node in {r.node for r in runs})
    window = [s for t, s in samples if begin <= t <= end]
    print(f"drained in {drained:.1f}s; shares measured over {end - begin:.1f}s ({len(window)} samples)")
    assert len(window) >= 20, (begin, end, len(samples))
    weights = {t: float(w) for t, w in WEIGHTS.items()}
    caps = {t: float(c) for t, c in CAPS.items()}
    held = {t: 0.0 for t in WEIGHTS}
    due = {t: 0.0 for t in WEIGHTS}
    for s in window:
        total = sum(s.get(t, 0) for t in WEIGHTS)
        for t, v in entitled(float(total), weights, caps).items():
            due[t] += v
        for t in WEIGHTS:
            held[t] += s.get(t, 0)
    grand = sum(held.values())
    assert grand > 0
    lines = [
        f"{t}: weight {WEIGHTS[t]}, mean running {held[t] / len(window):.2f}, "
        f"share {held[t] / grand:.3f} vs entitled {due[t] / grand:.3f}"
        for t in WEIGHTS
    ]
    ratio = held["team-a"] / held["team-b"] if held["team-b"] else float("inf")
    lines.append(f"team-a : team-b = {ratio:.2f} (weights 2 : 1)")
    print("\n".join(lines))
    for t in WEIGHTS:
        assert abs(held[t] - due[t]) / grand <= TOLERANCE, lines


def _print_logs(tmp: Path) -> None:
    for log in sorted(tmp.glob("*.log")):
        with contextlib.suppress(OSError):
            tail = log.read_text(errors="replace").splitlines()[-40:]
            print(f"--- {log.name} (last {len(tail)} lines)\n" + "\n".join(tail))
