"""Hostile peers: the daemon against a fake queue that misbehaves, and a throttling API server.

The fake queue (tests/support/fake_queue.py, an aiohttp server in the test) answers slowly, with
5xx, with malformed task JSON, with hostile ids, or instantly without holding the long poll. The
daemon must stay up, retry with a bound, and never loop tight: its requests per second are
counted. Hostile ids must never reach kubectl as options or paths: decoy Pods in the namespace
(unlabelled, and one carrying nymph's labels but no launch of ours) must survive, and nothing may
be created outside the workdir root.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nymph.localcluster import LocalCluster
from tests.support.fake_queue import FakeQueue
from tests.support.harness import NODE, DaemonProc, daemon_kubeconfig
from tests.support.tally import TALLY

pytestmark = [pytest.mark.faults, pytest.mark.e2e, pytest.mark.slow]

WINDOW = 5.0  # seconds each misbehaviour is watched
MAX_CLAIMS_PER_SECOND = 5  # a backoff or a held long poll keeps far under this
STALL = 30.0  # seconds without a new answer that fail the hostile-ids check


@dataclass
class Peer:
    kube: LocalCluster
    namespace: str
    kubeconfig: Path
    root: Path

    def daemon(self, fake: FakeQueue) -> DaemonProc:
        d = DaemonProc(fake, self.kubeconfig, self.namespace, self.root, extra=("--reap-after", "3600"))  # type: ignore[arg-type]
        return d.start()


@pytest.fixture
def peer(kube: LocalCluster, namespace: str, tmp_path: Path) -> Peer:
    return Peer(kube, namespace, daemon_kubeconfig(kube, namespace, tmp_path), tmp_path / "root")


def task(tid: str, *, kind: str, iid: Any, kube_ns: Any, spec: Any = None) -> dict[str, Any]:
    return {
        "taskId": tid,
        "kind": kind,
        "instanceId": iid,
        "namespace": "default",
        "kubeNamespace": kube_ns,
        "provider": "local",
        "spec": spec,
        "requester": "peer-test",
        "attempt": 1,
        "leaseExpiresAt": "2100-01-01T00:00:00.000Z",
    }


def answered_ids(fake: FakeQueue) -> set[Any]:
    return {b.get("taskId") for b in fake.completions()}


def crashes_in(log: Path) -> list[str]:
    """The distinct exceptions (last traceback line, where) the daemon logged as crashes."""
    found: set[str] = set()
    for line in log.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        exc = str(rec.get("exception") or "")
        if "Traceback" in exc:
            lines = [x for x in exc.splitlines() if x.strip()]
            where = next((x.strip() for x in reversed(lines) if x.strip().startswith("File ")), "")
            found.add(f"{lines[-1][:160]} at {where[-120:]}")
    return sorted(found)


def watch_window(fake: FakeQueue, d: DaemonProc) -> tuple[int, float]:
    t0 = time.monotonic()
    time.sleep(WINDOW)
    assert d.proc is not None and d.proc.poll() is None, "the daemon exited"
    claims = fake.count("claim", since=t0)
    return fake.max_per_second(since=t0), claims / WINDOW


@pytest.mark.parametrize(
    "how",
    ["slow", "5xx", "503", "not-json", "wrong-shape", "bad-tasks", "instant-empty"],
)
def test_misbehaving_queue_gets_bounded_retries(peer: Peer, how: str) -> None:
    malformed: list[Any] = [
        b"{not json",
        {"tasks": "all of them"},
        {"tasks": [1, None, "x"]},
        {"tasks": [{"taskId": 5}]},
        {"tasks": [{"taskId": "t-x", "kind": "launch"}]},
        {
            "tasks": [
                task("t-spec", kind="launch", iid="lakeshore-0000000a", kube_ns=peer.namespace, spec="nope")
            ]
        },
        {
            "tasks": [
                task(
                    "t-spec2",
                    kind="launch",
                    iid="lakeshore-0000000b",
                    kube_ns=peer.namespace,
                    spec={"a": [1] * 5},
                )
            ]
        },
        {"nope": True},
        [],
    ]
    fake = FakeQueue()
    if how == "slow":
        fake.delay = 25.0
    elif how in ("5xx", "503"):
        fake.status_for_all = 500 if how == "5xx" else 503
    elif how == "not-json":
        fake.claim_answer = lambda n: b"<html>gateway</html>" if n % 2 else b"\x00\xff{"
    elif how == "wrong-shape":
        fake.claim_answer = lambda n: malformed[n % 4 + 4] if n % 2 else malformed[n % 4]
    elif how == "bad-tasks":
        fake.claim_answer = lambda n: malformed[n % len(malformed)]
    elif how == "instant-empty":
        fake.claim_answer = lambda n: {"tasks": []}  # answers at once, ignoring the requested wait
    with fake:
        d = peer.daemon(fake)
        try:
            TALLY.bad_inputs += 1
            peak, rate = watch_window(fake, d)
            crashes = crashes_in(d.root.parent / f"daemon-{d.root.name}.log")
            assert not crashes, f"{how}: the daemon's loops crashed on the answers: {crashes}"
        finally:
            d.kill()
    assert peak <= MAX_CLAIMS_PER_SECOND * 2 and rate <= MAX_CLAIMS_PER_SECOND, (
        f"{how}: {rate:.1f} claims/s on average, {peak} requests in the busiest second"
    )


def test_hostile_ids_never_reach_kubectl(peer: Peer) -> None:
    kube, ns = peer.kube, peer.namespace
    decoys = ["decoy-plain", "lakeshore-decoy000"]
    for name in decoys:
        labels = (
            {"lakeshore": "true", "lakeshore.provider": "local"}
            if name.startswith("lakeshore")
            else {"app": "decoy"}
        )
        kube.api(
            "POST",
            f"/api/v1/namespaces/{ns}/pods",
            {
                "metadata": {"name": name, "labels": {**labels, "sim.nymph.io/run": "1h"}},
                "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "busybox"}]},
            },
        )
    hostile_ids: list[Any] = [
        "--all",
        "-l",
        "--selector=app=decoy",
        "../x",
        "../../etc",
        "a\x00b",
        "x" * 100_000,
        "decoy-plain",
        "lakeshore-decoy000",
        None,
        7,
        ["--all"],
    ]
    hostile_ns: list[Any] = [ns, "kube-system", "--all-namespaces", "../x", "default"]
    tasks = []
    for i, iid in enumerate(hostile_ids):
        for j, kns in enumerate(hostile_ns):
            tasks.append(task(f"stop-{i}-{j}", kind="stop", iid=iid, kube_ns=kns))
    base_spec = {
        "provider": "local",
        "ownerNamespace": "default",
        "namespace": ns,
        "image": "python:3.12-slim",
        "script": "print(1)\n",
    }
    for i, iid in enumerate(["--all", "../x", "a\x00b", "decoy-plain"]):
        tasks.append(
            task(f"launch-{i}", kind="launch", iid=iid, kube_ns=ns, spec={**base_spec, "instanceId": iid})
        )
    tasks.append(
        task(
            "launch-ns",
            kind="launch",
            iid="lakeshore-0000abcd",
            kube_ns="kube-system",
            spec={**base_spec, "instanceId": "lakeshore-0000abcd", "namespace": "kube-system"},
        )
    )
    batches = [tasks[i : i + 8] for i in range(0, len(tasks), 8)]
    fake = FakeQueue(claim_answer=lambda n: {"tasks": batches[n]} if n < len(batches) else None)
    TALLY.bad_inputs += len(tasks)
    with fake:
        d = peer.daemon(fake)
        try:
            # Every refusal is audited and its completion saved, each fsynced: on a busy disk 65
            # of them take a while. What must not happen is a stall: fail when no new answer came
            # for STALL seconds (or after a generous bound), not at a fixed time.
            answered: set[Any] = set()
            last_new, give_up = time.monotonic(), time.monotonic() + 240
            while len(answered) < len(tasks):
                now = answered_ids(fake)
                if len(now) > len(answered):
                    answered, last_new = now, time.monotonic()
                assert time.monotonic() - last_new < STALL and time.monotonic() < give_up, (
                    f"not every hostile task was answered: {len(answered)} of {len(tasks)}, "
                    f"{fake.count('claim')} claims, routes seen {sorted({x.route for x in fake.seen})}, "
                    f"unanswered {[t['taskId'] for t in tasks if t['taskId'] not in answered][:20]}; "
                    f"daemon log: {(peer.root.parent / f'daemon-{peer.root.name}.log').read_text()[-3000:]}"
                )
                assert d.proc is not None and d.proc.poll() is None, "the daemon exited"
                time.sleep(0.2)
            time.sleep(1.0)
        finally:
            d.kill()
    left = {p["metadata"]["name"] for p in kube.api("GET", f"/api/v1/namespaces/{ns}/pods")["items"]}
    problems = [f"decoy Pod {n} was deleted" for n in decoys if n not in left]
    by_id = {b["taskId"]: b for b in fake.completions()}
    for t in tasks:
        done = by_id.get(t["taskId"], {})
        if done.get("ok"):  # no id here is a valid instance id, no namespace but ns is served
            problems.append(
                f"{t['kind']} {str(t['instanceId'])[:30]!r} in {t['kubeNamespace']!r} completed ok"
            )
    for outside in (peer.root.parent / "x", peer.root.parent / "etc", peer.root / "x"):
        if outside.exists():
            problems.append(f"created {outside}")
    assert not problems, problems


def test_api_server_throttling_gets_backoff_not_a_tight_loop(peer: Peer, tmp_path: Path) -> None:
    """429s from the API server (a throttling front, see throttle.py): the daemon and its kubectl
    children back off, the daemon stays up, and the launches complete once the throttling ends."""
    import asyncio

    from tests.support.harness import QueueProc, launch, setup_provider, wait_state
    from tests.support.throttle import ThrottlingProxy

    q = QueueProc(tmp_path / "queue.db")
    q.tokens()
    q.start()
    asyncio.run(setup_provider(q, peer.namespace))
    with ThrottlingProxy(peer.kube) as proxy:
        kc = proxy.kubeconfig(peer.kubeconfig, tmp_path / "throttled.kubeconfig")
        d = DaemonProc(q, kc, peer.namespace, peer.root, extra=("--reap-after", "3600")).start()
        try:
            warm = asyncio.run(launch(q, tags={"sim.nymph.io/run": "1s"}))
            asyncio.run(wait_state(q, warm, {"stopped"}))
            proxy.throttling = True
            t0 = time.monotonic()
            ids = [asyncio.run(launch(q, tags={"sim.nymph.io/run": "1s"})) for _ in range(4)]
            TALLY.launches += 5
            time.sleep(WINDOW)
            proxy.throttling = False
            peak, total, refused = proxy.max_per_second(t0), proxy.count(t0), proxy.count(t0, throttled=True)
            assert d.proc is not None and d.proc.poll() is None, "the daemon exited under throttling"
            ends = [asyncio.run(wait_state(q, iid, {"stopped"}, timeout=90)) for iid in ids]
        finally:
            d.kill()
            q.kill()
    assert refused > 0, "the throttling front refused nothing: the test did not throttle"
    assert peak <= 30 and total / WINDOW <= 15, (
        f"{total / WINDOW:.1f} requests/s to a throttling API server, {peak} in the busiest second"
    )
    assert [e["reason"] for e in ends] == ["Completed"] * len(ids), [
        (e["reason"], e["message"]) for e in ends
    ]
