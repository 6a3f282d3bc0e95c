"""The daemon through an API server outage and after a crash, without a cluster (what the crash
matrix found).

* An outage the daemon can see (its watches are down, the apply says Unavailable) costs a task
  none of its attempts: the task is handed back, not completed, and nothing is claimed until the
  watches are back.
* A workdir with no Pod and no task in hand (a launch killed before its Pod existed) is reaped
  after a grace period; one in use never is.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

from nymph.daemon.podreaper import ORPHAN_GRACE_MIN, Reaper, orphan_grace
from nymph.daemon.settings import WorkSettings
from nymph.daemon.tasks.validate import check_task
from nymph.kube import errors as ke
from tests.daemon.test_faults_in_process import NODE, NS, Rig, checked, iid, rig, task, until

UNREACHABLE = "dial tcp 127.0.0.1:6443: connect: connection refused"


def outage(r: Rig, *, down: bool) -> Rig:
    """The rig's handlers see the API server as ``down`` (watches disconnected) or up."""
    r.cache.connected = not down
    r.ctx = replace(r.ctx, kube_ok=r.ctx.tracker.connected, hand_back=r.claimer.leases.abandon)
    return r


def audit_results(r: Rig, action: str) -> list[str]:
    import json

    lines = (r.root / "audit.jsonl").read_text().splitlines()
    return [rec["result"] for rec in map(json.loads, lines) if rec.get("action") == action]


# --- an outage costs no attempt --------------------------------------------------------------------


async def test_a_launch_that_meets_an_outage_is_handed_back_not_failed(tmp_path: Path) -> None:
    from nymph.daemon.tasks import pods

    r = outage(rig(tmp_path), down=True)
    t = task("launch", 1)
    r.claimer.leases.held[t["taskId"]] = t
    r.applier.errors = {iid(1): [ke.Unavailable(UNREACHABLE)] * 3}
    await pods.launch(r.ctx, checked([t]))
    # No completion (which would spend one of the queue's attempts): the lease is handed back.
    assert r.completions() == {}
    assert r.claimer.leases.held == {} and r.claimer.leases.abandoned == [t["taskId"]]
    await r.claimer.release_abandoned()
    assert r.queue.released == [t["taskId"]]
    assert audit_results(r, "apply") == ["handed-back"]
    # The workdir stays for the Pod the server may have accepted (a redelivery adopts it).
    assert (tmp_path / "work" / iid(1)).is_dir()


async def test_an_unavailable_api_server_the_watch_still_reaches_is_a_retryable_failure(
    tmp_path: Path,
) -> None:
    from nymph.daemon.tasks import pods

    r = outage(rig(tmp_path), down=False)
    t = task("launch", 1)
    r.claimer.leases.held[t["taskId"]] = t
    r.applier.errors = {iid(1): [ke.Unavailable("the server is currently unable")] * 3}
    await pods.launch(r.ctx, checked([t]))
    done = r.completions()[t["taskId"]]
    assert done["ok"] is False and done["retryable"] is True and r.claimer.leases.abandoned == []


async def test_a_stop_that_meets_an_outage_is_handed_back(tmp_path: Path) -> None:
    from nymph.daemon.tasks import pods

    r = outage(rig(tmp_path), down=True)
    t = task("stop", 1)
    r.claimer.leases.held[t["taskId"]] = t

    async def unreachable(**kw: Any) -> bool:
        raise ke.Unavailable(UNREACHABLE)

    r.applier.delete_pod = unreachable  # type: ignore[method-assign]
    await pods.stop(r.ctx, check_task(t, served=(NS,)))
    assert r.completions() == {} and r.claimer.leases.abandoned == [t["taskId"]]
    assert audit_results(r, "delete") == ["handed-back"]


async def test_nothing_is_claimed_while_the_api_server_is_unreachable(tmp_path: Path) -> None:
    r = rig(tmp_path)
    reachable = [False]
    r.claimer.kube_ok = lambda: reachable[0]
    r.claimer.leases.abandoned = ["task-00000000000000aa"]  # handed back in the outage
    r.queue.offers = [[task("launch", 1)]]
    reconciled, stopping = asyncio.Event(), asyncio.Event()
    reconciled.set()
    loop = asyncio.create_task(r.claimer.claim_loop(reconciled=reconciled, stopping=stopping))
    try:
        # What was handed back is released at once, while claiming waits for the API server.
        await until(lambda: r.queue.released == ["task-00000000000000aa"])
        await asyncio.sleep(0.3)
        assert r.queue.offers and r.claimer.leases.held == {}
        reachable[0] = True
        await until(lambda: "task-0000000000000001" in r.claimer.leases.held)
    finally:
        stopping.set()
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)


# --- orphaned workdirs -----------------------------------------------------------------------------


def reaper(r: Rig, *, busy: set[str] | None = None, reap_after: float = 2.0) -> Reaper:
    return Reaper(
        settings=WorkSettings(root=r.root, reap_after_seconds=reap_after),
        node=NODE,
        tracker=r.ctx.tracker,
        applier=r.applier,
        outbox=r.outbox,
        workdirs=r.ctx.workdirs,
        audit=r.audit,
        metrics=r.ctx.metrics,
        busy=lambda: busy or set(),
    )


def test_the_orphan_grace_covers_a_watch_that_lags_an_apply() -> None:
    assert orphan_grace(WorkSettings(reap_after_seconds=2)) == ORPHAN_GRACE_MIN
    assert orphan_grace(WorkSettings(reap_after_seconds=600)) == 600


def test_a_workdir_with_no_pod_and_no_task_is_reaped_after_the_grace(tmp_path: Path) -> None:
    r = rig(tmp_path)
    wd = r.ctx.workdirs
    for n in (1, 2, 3):
        wd.create(iid(n))
    (wd.base / "not-an-instance").mkdir()  # nothing nymph named: never touched
    r.cache.cache[iid(2)] = {"metadata": {"name": iid(2), "namespace": NS}}  # its Pod exists
    rp = reaper(r, busy={iid(3)})  # its task is in hand (the Pod is about to be applied)
    assert rp.reap_orphans(now=100.0) == []
    assert rp.reap_orphans(now=100.0 + ORPHAN_GRACE_MIN - 1) == []
    assert rp.reap_orphans(now=100.0 + ORPHAN_GRACE_MIN) == [iid(1)]
    assert sorted(wd.existing()) == sorted([iid(2), iid(3), "not-an-instance"])
    assert audit_results(r, "reap") == ["orphaned workdir removed"]


def test_a_workdir_in_use_again_restarts_its_clock(tmp_path: Path) -> None:
    r = rig(tmp_path)
    r.ctx.workdirs.create(iid(1))
    busy: set[str] = set()
    rp = reaper(r, busy=busy)
    rp.busy = lambda: busy
    assert rp.reap_orphans(now=0.0) == []
    busy.add(iid(1))  # redelivered: the launch is in hand again
    assert rp.reap_orphans(now=ORPHAN_GRACE_MIN) == []
    busy.clear()
    assert rp.reap_orphans(now=ORPHAN_GRACE_MIN + 1) == []
    assert rp.reap_orphans(now=2 * ORPHAN_GRACE_MIN + 1) == [iid(1)]


def test_nothing_is_reaped_as_orphaned_while_the_watch_is_disconnected(tmp_path: Path) -> None:
    r = rig(tmp_path)
    r.ctx.workdirs.create(iid(1))
    rp = reaper(r)
    assert rp.reap_orphans(now=0.0) == []
    r.cache.connected = False  # its Pod may exist, unseen
    assert rp.reap_orphans(now=1000.0) == []
    r.cache.connected = True  # the clock starts again once the cache is fresh
    assert rp.reap_orphans(now=1001.0) == []
    assert rp.reap_orphans(now=1001.0 + ORPHAN_GRACE_MIN) == [iid(1)]


# --- the Pod reaper --------------------------------------------------------------------------------


async def test_finished_pods_are_reaped_several_at_once_and_not_while_disconnected(tmp_path: Path) -> None:
    import time

    from nymph.daemon.podreaper import REAP_CONCURRENCY

    r = rig(tmp_path)
    deleted: list[str] = []

    async def slow_delete(
        *, namespace: str, name: str, grace_seconds: int | None, uid: str | None = None
    ) -> bool:
        await asyncio.sleep(0.3)
        deleted.append(name)
        return True

    r.applier.delete_pod = slow_delete  # type: ignore[method-assign]
    tracker = r.ctx.tracker
    for n in range(1, REAP_CONCURRENCY + 1):
        tracker.track(iid(n), namespace=NS).finished_at = time.monotonic() - 10
    rp = reaper(r, reap_after=0.1)
    r.cache.connected = False  # the API server is unreachable: nothing is tried
    job = asyncio.create_task(rp.run())
    try:
        await asyncio.sleep(1.0)
        assert deleted == [] and not any(t.reaping for t in tracker.tracks.values())
        r.cache.connected = True
        t0 = time.monotonic()
        await until(lambda: len(deleted) == REAP_CONCURRENCY)
        # One by one they would take 0.3 s each.
        assert time.monotonic() - t0 < 0.3 * REAP_CONCURRENCY / 2
    finally:
        job.cancel()
        await asyncio.gather(job, return_exceptions=True)
    assert sorted(deleted) == sorted(iid(n) for n in range(1, REAP_CONCURRENCY + 1))


async def test_a_queue_sending_only_tasks_that_do_not_check_out_is_not_asked_in_a_tight_loop(
    tmp_path: Path,
) -> None:
    r = rig(tmp_path)
    junk = task("stop", 1, instanceId="--all")  # refused by the runner, for good
    r.queue.offers = [[junk] for _ in range(20)]
    reconciled, stopping = asyncio.Event(), asyncio.Event()
    reconciled.set()
    loop = asyncio.create_task(r.claimer.claim_loop(reconciled=reconciled, stopping=stopping))
    try:
        await asyncio.sleep(0.6)
        # Paced like an empty answer (0.1 s, then doubling): a handful of claims, not 20 at once.
        assert 20 - len(r.queue.offers) <= 4
    finally:
        stopping.set()
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)


def test_a_finished_pod_stays_until_the_queue_has_its_last_report(tmp_path: Path) -> None:
    """The queue away, a lease lost, the launch redelivered: a Pod reaped before its ``stopped``
    report reached the queue would be created again. It stays until the report is sent."""
    import time

    from nymph.daemon.tracker import Report
    from nymph.launch.state import InstanceState, Reason

    r = rig(tmp_path)
    tracker = r.ctx.tracker
    track = tracker.track(iid(1), namespace=NS)
    tracker.report(iid(1), track, Report(InstanceState.STOPPED, Reason.COMPLETED))
    track.finished_at = time.monotonic() - 60
    rp = reaper(r)
    now = time.monotonic()
    assert not rp.due(iid(1), track, now=now)  # its report waits in the outbox
    r.outbox.mem.clear()  # sent: the queue has it
    assert rp.due(iid(1), track, now=now)
    r.outbox.backlog = 3  # reports wait on disk, unread: any of them may be this Pod's
    assert not rp.due(iid(1), track, now=now)
    r.outbox.backlog = 0
    tracker.unsaved.append((iid(1), Report(InstanceState.STOPPED), None))  # not even saved yet
    assert not rp.due(iid(1), track, now=now)
