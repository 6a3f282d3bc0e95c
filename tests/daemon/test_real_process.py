"""The daemon against the real API server (kwok-simulated Pods) and the real queue service.

Every daemon here authenticates with a ServiceAccount token bound to exactly the Role in
manifests/base/daemon-role.yaml, so these tests also prove that Role sufficient.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from nymph.localcluster import LocalCluster
from nymph.localcluster.cluster import kubectl_path
from tests.support.harness import (
    NODE,
    DaemonProc,
    QueueProc,
    daemon_kubeconfig,
    launch,
    nymph,
    pods,
    setup_provider,
    wait_state,
)

pytestmark = pytest.mark.e2e


@dataclass
class Stack:
    kube: LocalCluster
    namespace: str
    queue: QueueProc
    daemon: DaemonProc
    tmp: Path

    def new_daemon(self, *extra: str) -> DaemonProc:
        return DaemonProc(self.queue, self.daemon.kubeconfig, self.namespace, self.daemon.root, extra=extra)


@pytest.fixture
def stack(
    kube: LocalCluster, namespace: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Stack]:
    q = QueueProc(tmp_path / "queue.db")
    q.tokens()
    q.start()
    extra = tuple(getattr(request, "param", ()))
    kc = daemon_kubeconfig(kube, namespace, tmp_path)
    d = DaemonProc(q, kc, namespace, tmp_path / "root", extra=("--reap-after", "3600", *extra))
    asyncio.run(setup_provider(q, namespace))
    d.start()
    s = Stack(kube, namespace, q, d, tmp_path)
    try:
        yield s
    finally:
        # Tests replace the daemon (restarts): kill the current one as well as the first.
        for proc in (s.daemon, d, q):
            proc.kill()


def history(inst: dict) -> list[str]:  # type: ignore[type-arg]
    states = [h["state"] for h in inst["history"]]
    return [s for i, s in enumerate(states) if i == 0 or s != states[i - 1]]


async def test_launch_succeeds_and_fails_with_reasons(stack: Stack) -> None:
    env = stack.queue.user_env()
    (stack.tmp / "job.py").write_text("print('hello')\n")
    ok = await asyncio.to_thread(
        nymph,
        "launch",
        "local",
        "--mode",
        "py",
        "--script",
        str(stack.tmp / "job.py"),
        "--tag",
        "team=ml",
        "--wait",
        env=env,
    )
    assert ok.returncode == 0, ok.stderr
    iid = ok.stdout.strip().splitlines()[0]
    for state in ("queued", "starting", "running", "stopped"):
        assert state in ok.stderr + ok.stdout
    bad = await asyncio.to_thread(
        nymph,
        "launch",
        "local",
        "--mode",
        "py",
        "--script",
        str(stack.tmp / "job.py"),
        "--tag",
        "sim.nymph.io/outcome=fail",
        "--wait",
        env=env,
    )
    assert bad.returncode != 0
    bad_id = bad.stdout.strip().splitlines()[0]

    good = await wait_state(stack.queue, iid, {"stopped"})
    assert good["reason"] == "Completed"
    assert history(good) == ["queued", "starting", "running", "stopped"]
    failed = await wait_state(stack.queue, bad_id, {"stopped"})
    assert failed["reason"] == "Error"
    assert "exit code 1" in (failed["message"] or "")

    listing = await asyncio.to_thread(nymph, "instances", "local", env=env)
    assert iid in listing.stdout and bad_id in listing.stdout and "Completed" in listing.stdout

    (pod,) = [p for p in pods(stack.kube, stack.namespace) if p["metadata"]["name"] == iid]
    assert pod["metadata"]["labels"]["team"] == "ml"
    assert pod["metadata"]["labels"]["lakeshore.provider"] == "local"
    assert pod["spec"]["nodeName"] == NODE
    assert pod["spec"]["volumes"][0]["hostPath"]["path"] == str(stack.daemon.root / "work" / iid)
    assert (stack.daemon.root / "work" / iid).is_dir()
    metrics = stack.daemon.metrics()
    assert 'nymph_launches_total{result="applied"} 2.0' in metrics


async def test_image_pull_failure_is_reported_while_pending(stack: Stack) -> None:
    iid = await launch(stack.queue, tags={"sim.nymph.io/outcome": "image-pull"})
    deadline = time.monotonic() + 30
    async with stack.queue.client() as c:
        while True:
            inst = await c.get_instance(provider="local", instance_id=iid)
            if inst["reason"] == "ImagePull":
                break
            assert time.monotonic() < deadline, inst
            await asyncio.sleep(0.2)
    assert inst["state"] == "starting"


async def test_stop_before_start_while_running_and_after_manual_delete(stack: Stack) -> None:
    # Before start: the daemon is down, so the launch is still queued when the stop arrives.
    stack.daemon.kill()
    early = await launch(stack.queue, tags={"sim.nymph.io/run": "1h"})
    async with stack.queue.client() as c:
        await c.stop(provider="local", instance_id=early)
    d2 = stack.new_daemon()
    d2.start()
    stack.daemon = d2
    inst = await wait_state(stack.queue, early, {"stopped"})
    assert inst["reason"] == "Stopped"

    running = await launch(stack.queue, tags={"sim.nymph.io/run": "1h"})
    by_hand = await launch(stack.queue, tags={"sim.nymph.io/run": "1h"})
    await wait_state(stack.queue, running, {"running"})
    await wait_state(stack.queue, by_hand, {"running"})

    async with stack.queue.client() as c:
        await c.stop(provider="local", instance_id=running)
    inst = await wait_state(stack.queue, running, {"stopped"})
    assert inst["reason"] == "Stopped"
    assert "stopping" in history(inst)

    stack.kube.api("DELETE", f"/api/v1/namespaces/{stack.namespace}/pods/{by_hand}")
    inst = await wait_state(stack.queue, by_hand, {"stopped"})
    assert inst["reason"] == "Deleted"
    async with stack.queue.client() as c:
        await c.stop(provider="local", instance_id=by_hand)  # a Pod already gone: still fine
    assert (await wait_state(stack.queue, by_hand, {"stopped"}))["reason"] == "Deleted"

    names = {p["metadata"]["name"] for p in pods(stack.kube, stack.namespace)}
    assert early not in names and running not in names and by_hand not in names


async def test_kill9_during_a_batch_then_restart_gives_exactly_one_pod_each(stack: Stack) -> None:
    ids = [await launch(stack.queue, tags={"sim.nymph.io/run": "4s"}) for _ in range(12)]
    deadline = time.monotonic() + 30
    while not pods(stack.kube, stack.namespace):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    stack.daemon.kill()  # mid-batch: some applied, some claimed-not-reported, some queued
    more = [await launch(stack.queue, tags={"sim.nymph.io/run": "2s"}) for _ in range(4)]
    d2 = stack.new_daemon()
    d2.start()
    stack.daemon = d2
    for iid in ids + more:
        inst = await wait_state(stack.queue, iid, {"stopped"}, timeout=90)
        assert inst["reason"] == "Completed", inst
    all_pods = pods(stack.kube, stack.namespace)
    names = [p["metadata"]["name"] for p in all_pods]
    assert sorted(names) == sorted(ids + more), "every launch has exactly one Pod, none extra"
    audit = [json.loads(line) for line in (stack.daemon.root / "audit.jsonl").read_text().splitlines()]
    applied = [r["instance"] for r in audit if r["action"] == "apply" and r.get("result") == "ok"]
    assert len(applied) == len(set(applied)), "no launch was applied twice"


async def test_queue_outage_loses_no_report_and_keeps_order(stack: Stack) -> None:
    iid = await launch(stack.queue, tags={"sim.nymph.io/run": "3s"})
    await wait_state(stack.queue, iid, {"running"})
    stack.queue.kill()
    # While the queue is down the Pod finishes; the daemon must keep the report.
    deadline = time.monotonic() + 30
    while True:
        (pod,) = [p for p in pods(stack.kube, stack.namespace) if p["metadata"]["name"] == iid]
        if pod["status"].get("phase") == "Succeeded":
            break
        assert time.monotonic() < deadline
        await asyncio.sleep(0.2)
    await asyncio.sleep(1.0)
    assert stack.daemon.proc is not None and stack.daemon.proc.poll() is None, "the daemon must not exit"
    assert (
        "nymph_reports_buffered 1.0" in stack.daemon.metrics()
        or "nymph_reports_buffered 2.0" in stack.daemon.metrics()
    )
    stack.queue.start()  # same db, same port
    inst = await wait_state(stack.queue, iid, {"stopped"}, timeout=60)
    assert inst["reason"] == "Completed"
    assert history(inst) == ["queued", "starting", "running", "stopped"]


async def test_audit_verify_passes_on_a_real_run_and_fails_on_tampering(stack: Stack) -> None:
    ids = [await launch(stack.queue, tags={"sim.nymph.io/run": "1s"}) for _ in range(3)]
    for iid in ids:
        await wait_state(stack.queue, iid, {"stopped"})
    log = stack.daemon.root / "audit.jsonl"
    ok = nymph("audit", "verify", str(log))
    assert ok.returncode == 0, ok.stderr
    lines = log.read_text().splitlines()
    assert len(lines) >= 6
    text = log.read_text()
    assert (
        "print('hi')" not in text
        and stack.queue.daemon_token not in text
        and stack.queue.user_token not in text
    )

    def check(mutated: list[str], expect: str) -> None:
        bad = stack.tmp / "tampered.jsonl"
        bad.write_text("\n".join(mutated) + "\n")
        head = log.with_name(log.name + ".head")
        (stack.tmp / "tampered.jsonl.head").write_text(head.read_text())
        res = nymph("audit", "verify", str(bad))
        assert res.returncode == 1
        assert expect in res.stderr, res.stderr

    edited = list(lines)
    rec = json.loads(edited[2])
    rec["result"] = "something-else"
    edited[2] = json.dumps(rec, sort_keys=True, separators=(",", ":"))
    check(edited, "seq=3")
    check(lines[:2] + lines[3:], "seq=4")
    check([lines[0], lines[2], lines[1], *lines[3:]], "seq=3")
    check(lines[:-1], "removed from the end")


@pytest.mark.parametrize("stack", [("--apply-with", "api")], indirect=True)
async def test_api_apply_mode(stack: Stack) -> None:
    iid = await launch(stack.queue, tags={"sim.nymph.io/run": "1s"})
    inst = await wait_state(stack.queue, iid, {"stopped"})
    assert inst["reason"] == "Completed"
    assert 'nymph_apply_seconds_count{applier="api"}' in stack.daemon.metrics()


async def test_invalid_pod_fails_the_launch_with_the_api_servers_message(stack: Stack) -> None:
    async with stack.queue.client() as c:
        await c.create_mode(
            name="huge",
            provider="local",
            fields={
                "image": "python:3.12-slim",
                "resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}},
            },
        )
        accepted = await c.launch(provider="local", mode="huge", script="print(1)\n")
    inst = await wait_state(stack.queue, accepted["instanceId"], {"stopped"})
    assert inst["reason"] == "LaunchFailed"
    assert "must be less than or equal to cpu limit" in (inst["message"] or "")


async def test_sigterm_exits_zero_and_probe_reports_rbac(stack: Stack) -> None:
    res = await asyncio.to_thread(
        nymph, "providers", "test", "local", "--mode", "py", env=stack.queue.user_env()
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "dry-run apply" in res.stdout and "create pods" in res.stdout
    assert stack.daemon.terminate() == 0
    log = (stack.daemon.root.parent / f"daemon-{stack.daemon.root.name}.log").read_text()
    assert '"event_loop":"uvloop"' in log  # what the deployed daemon runs on


def test_daemon_identity_cannot_read_secrets(stack: Stack) -> None:
    res = subprocess.run(
        [kubectl_path(), f"--kubeconfig={stack.daemon.kubeconfig}", "-n", stack.namespace, "get", "secrets"],
        capture_output=True,
        text=True,
    )
    assert res.returncode != 0 and "forbidden" in res.stderr.lower()


async def test_daemon_restarts_after_a_kill_between_an_audit_record_and_its_head(stack: Stack) -> None:
    iid = await launch(stack.queue, tags={"sim.nymph.io/run": "1s"})
    await wait_state(stack.queue, iid, {"stopped"})
    stack.daemon.kill()
    log = stack.daemon.root / "audit.jsonl"
    head = log.with_name(log.name + ".head")
    records = [json.loads(line) for line in log.read_text().splitlines()]
    # The state a kill -9 leaves between the fsync of a record and the rewrite of the head,
    # plus a torn line from a write cut short.
    head.write_text(json.dumps({"seq": records[-2]["seq"], "hash": records[-2]["hash"]}))
    with log.open("a") as fh:
        fh.write('{"action":"claim","se')
    d2 = stack.new_daemon()
    d2.start()  # used to exit 2: "records are missing"
    stack.daemon = d2
    again = await launch(stack.queue, tags={"sim.nymph.io/run": "1s"})
    assert (await wait_state(stack.queue, again, {"stopped"}))["reason"] == "Completed"
    res = nymph("audit", "verify", str(log))
    assert res.returncode == 0, res.stderr
    events = [json.loads(line).get("event") for line in log.read_text().splitlines()]
    assert "head-recovered" in events and "torn-tail-truncated" in events


async def test_a_running_pod_of_an_older_daemon_is_followed_after_an_upgrade(stack: Stack) -> None:
    """A daemon watches only Pods labelled with its node. A Pod an older daemon rendered has no
    such label: the new daemon on that node gives it the label before its watch starts, then
    follows the launch to its end as if it had applied it."""
    iid = await launch(stack.queue, tags={"sim.nymph.io/run": "6s"})
    await wait_state(stack.queue, iid, {"running"}, timeout=60)
    stack.daemon.kill()
    stack.kube.api(
        "PATCH",
        f"/api/v1/namespaces/{stack.namespace}/pods/{iid}",
        {"metadata": {"labels": {"nymph.io/node": None}}},
        content_type="application/merge-patch+json",
    )
    d2 = stack.new_daemon()
    d2.start()
    stack.daemon = d2
    inst = await wait_state(stack.queue, iid, {"stopped"}, timeout=90)
    assert inst["reason"] == "Completed", inst
    pod = stack.kube.api("GET", f"/api/v1/namespaces/{stack.namespace}/pods/{iid}")
    assert pod["metadata"]["labels"]["nymph.io/node"] == NODE
