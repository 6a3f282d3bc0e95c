"""The daemon under faults and hostile tasks, without a cluster.

A full or unwritable root (a failing write injected into the audit log and the write test), a
queue sending hostile fields, a launch that cannot be rendered in a batch, a batch refused as a
whole, and a foreign Pod holding a launch's name.
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from nymph.client import QueueClient
from nymph.daemon.audit import AuditLog, verify
from nymph.daemon.claimer import Claimer
from nymph.daemon.diskhealth import DiskHealth
from nymph.daemon.health import VIEW_KEY, HealthView, readyz
from nymph.daemon.leases import LeaseLedger
from nymph.daemon.metrics import Metrics
from nymph.daemon.outbox import Outbox
from nymph.daemon.runner import HandlerRegistry, Runner
from nymph.daemon.settings import DaemonQueueSettings, DaemonSettings
from nymph.daemon.tasks import pods
from nymph.daemon.tasks.context import TaskContext
from nymph.daemon.tasks.identity import ANNOTATION_LAUNCH
from nymph.daemon.tasks.validate import BadTask, CheckedTask, check_task, intake
from nymph.daemon.tracker import Report, Tracker
from nymph.daemon.workdirs import Workdirs
from nymph.daemon.workqueue import WorkQueue
from nymph.kube import errors as ke
from nymph.kube.applier import ApplyOutcome, object_key
from nymph.kube.kubectl import Kubectl, KubectlResult
from nymph.launch.state import InstanceState, Reason
from nymph.protocol import TaskJSON, TaskKind
from tests.support.watch_cache import WatchCache

NS, OWNER, NODE = "jobs", "team", "node-a"


def iid(n: int) -> str:
    return f"lakeshore-{n:08x}"


def launch_spec(n: int, **extra: Any) -> dict[str, Any]:
    return {
        "instanceId": iid(n),
        "provider": "p",
        "ownerNamespace": OWNER,
        "namespace": NS,
        "image": "busybox",
        "script": "print(1)\n",
        **extra,
    }


def checked(tasks: list[TaskJSON]) -> list[CheckedTask]:
    """The tasks as the claimer checked them: what a handler receives."""
    return [check_task(t, served=(NS,)) for t in tasks]


def task(kind: str, n: int = 1, *, spec: Any = None, **fields: Any) -> TaskJSON:
    body: dict[str, Any] = {
        "taskId": f"task-{n:016x}",
        "kind": kind,
        "instanceId": iid(n),
        "namespace": OWNER,
        "kubeNamespace": NS,
        "provider": "p",
        "spec": launch_spec(n) if spec is None and kind in ("launch", "probe") else spec,
        "requester": "alice",
        "attempt": 1,
    }
    body.update(fields)
    return cast(TaskJSON, body)


# --- every field of every task is checked ---------------------------------------------


def test_a_good_task_checks_out() -> None:
    checked = check_task(task("stop", 7), served=(NS,))
    assert (checked.kind, checked.instance_id, checked.kube_namespace) == (TaskKind.STOP, iid(7), NS)
    assert check_task(task("launch", 7), served=(NS,)).namespace == OWNER


HOSTILE: list[tuple[dict[str, Any], str]] = [
    ({"instanceId": "--all"}, "instanceId"),
    ({"instanceId": "lakeshore-0000000a --all"}, "instanceId"),
    ({"instanceId": "lakeshore-0000000a,x=y"}, "instanceId"),
    ({"instanceId": None}, "instanceId"),
    ({"instanceId": ["lakeshore-00000001"]}, "instanceId"),
    ({"instanceId": "../../etc"}, "instanceId"),
    ({"kubeNamespace": "team-b"}, "does not serve"),
    ({"kubeNamespace": "--all-namespaces"}, "kubeNamespace"),
    ({"kubeNamespace": "jobs\n"}, "kubeNamespace"),
    ({"kubeNamespace": None}, "kubeNamespace"),
    ({"namespace": "A B"}, "namespace"),
    ({"namespace": {"x": 1}}, "namespace"),
    ({"kind": "reboot"}, "unknown task kind"),
    ({"kind": ["stop"]}, "unknown task kind"),
    ({"spec": "rm -rf /"}, "spec"),
    ({"spec": {"dockyard": "x"}}, "spec.dockyard"),
    ({"gracePeriodSeconds": "-1"}, "gracePeriodSeconds"),
    ({"gracePeriodSeconds": -5}, "gracePeriodSeconds"),
    ({"gracePeriodSeconds": True}, "gracePeriodSeconds"),
    ({"gracePeriodSeconds": 10**12}, "gracePeriodSeconds"),
    ({"attempt": "1; drop"}, "attempt"),
    ({"requester": "x" * 100_000}, "requester"),
]


@pytest.mark.parametrize(("fields", "named"), HOSTILE)
def test_hostile_stop_fields_are_refused_naming_the_field(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(BadTask, match=named) as caught:
        check_task({**task("stop", 3), **fields}, served=(NS,))
    assert caught.value.task_id == "task-0000000000000003"
    assert len(str(caught.value)) < 1000


@pytest.mark.parametrize(
    "spec",
    [None, "x", [], launch_spec(2), {**launch_spec(1), "namespace": "other"}],
)
def test_a_launch_spec_must_be_the_tasks_own(spec: Any) -> None:
    bad = task("launch", 1)
    bad["spec"] = spec
    with pytest.raises(BadTask, match="spec"):
        check_task(bad, served=(NS,))


@pytest.mark.parametrize("tid", [None, 7, "", "-rf", "a b", "x" * 200, {"a": 1}, "t\n1"])
def test_a_task_without_a_usable_id_cannot_be_completed(tid: Any) -> None:
    with pytest.raises(BadTask) as caught:
        check_task(task("stop", taskId=tid), served=(NS,))
    assert caught.value.task_id is None
    with pytest.raises(BadTask):
        check_task("not a task", served=(NS,))


# --- a harness: a claimer and a runner on a real outbox and audit log --------------------------


class Disk:
    """A write seam: fails with ``errno_`` while ``full`` is set."""

    def __init__(self) -> None:
        self.full = False
        self.errno_ = errno.ENOSPC

    def write(self, fd: int, data: bytes) -> int:
        import os

        if self.full:
            raise OSError(self.errno_, "No space left on device")
        return os.write(fd, data)


@dataclass
class FakeQueue:
    """What the claimer calls on the queue."""

    offers: list[list[TaskJSON]] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    renewed: list[list[str]] = field(default_factory=list)

    async def claim(self, **kw: Any) -> list[TaskJSON]:
        if self.offers:
            return self.offers.pop(0)
        await asyncio.sleep(0.01)
        return []

    async def release(self, *, daemon_id: str, task_ids: list[str]) -> list[str]:
        self.released.extend(task_ids)
        return task_ids

    async def renew(self, **kw: Any) -> dict[str, Any]:
        self.renewed.append(list(kw["task_ids"]))
        return {"lost": []}


class ScriptedApplier:
    name = "scripted"

    def __init__(self, errors: dict[str, list[ke.KubeError | None]] | None = None) -> None:
        self.errors = errors or {}
        self.calls: list[list[str]] = []
        self.applied: list[Mapping[str, Any]] = []
        self.refuse_batches_with: str | None = None

    async def apply(
        self, manifests: Sequence[Mapping[str, Any]], *, dry_run: bool = False
    ) -> list[ApplyOutcome]:
        names = [object_key(m)[1] for m in manifests]
        self.calls.append(names)
        self.applied.extend(manifests)
        if self.refuse_batches_with in names:
            raise ke.Invalid("error parsing STDIN: the stream as a whole was refused")
        out = []
        for n, m in zip(names, manifests, strict=True):
            script = self.errors.get(n) or []
            out.append(ApplyOutcome(NS, n, error=script.pop(0) if script else None, obj=dict(m)))
        return out

    async def delete_pod(
        self, *, namespace: str, name: str, grace_seconds: int | None, uid: str | None = None
    ) -> bool:
        return False

    async def pod_logs(self, *, namespace: str, name: str, limit_bytes: int) -> str:
        return ""

    async def can_i(self, *, verb: str, resource: str, namespace: str) -> bool:
        return True


@dataclass
class Rig:
    root: Path
    disk: Disk
    health: DiskHealth
    queue: FakeQueue
    outbox: Outbox
    audit: AuditLog
    claimer: Claimer
    ctx: TaskContext
    applier: ScriptedApplier
    cache: WatchCache

    def completions(self) -> dict[str, dict[str, Any]]:
        return {i["taskId"]: i for i in self.outbox.mem if i["kind"] == "complete"}


def rig(tmp_path: Path) -> Rig:
    disk = Disk()
    metrics = Metrics()
    outbox = Outbox(tmp_path / "state")
    audit = AuditLog(tmp_path / "audit.jsonl", write=disk.write)
    health = DiskHealth(directories=(tmp_path,), interval=0.02, write=disk.write)
    settings = DaemonSettings(
        daemon_id="d1", node=NODE, queue=replace(DaemonQueueSettings(), poll_wait=0.2, lease_seconds=3)
    )
    queue = FakeQueue()
    leases = LeaseLedger(outbox=outbox, disk=health)
    claimer = Claimer(
        settings=settings,
        client=cast(QueueClient, queue),
        leases=leases,
        work=WorkQueue(leases=leases, metrics=metrics, in_flight=settings.in_flight),
        audit=audit,
        metrics=metrics,
        disk=health,
    )
    workdirs = Workdirs(root=tmp_path)
    tracker = Tracker(node=NODE, outbox=outbox, metrics=metrics, workdirs=workdirs)
    cache = WatchCache(NS)
    tracker.follow(cache)
    applier = ScriptedApplier()
    ctx = TaskContext(
        applier=applier,
        kubectl=Kubectl(),
        tracker=tracker,
        complete=claimer.leases.complete,
        audit=audit,
        metrics=metrics,
        workdirs=workdirs,
        namespaces=(NS,),
        node=NODE,
        daemon_id="d1",
        workdir_root=tmp_path,
        delete_grace_seconds=None,
        stopping=asyncio.Event(),
        disk=health,
    )
    return Rig(tmp_path, disk, health, queue, outbox, audit, claimer, ctx, applier, cache)


async def until(check: Any, timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


async def ready_status(r: Rig) -> tuple[int, dict[str, Any]]:
    import json

    app = web.Application()
    app[VIEW_KEY] = HealthView(
        stale_after=60,
        last_progress=lambda: r.claimer.last_progress,
        queue_ok=lambda: True,
        kube_ok=lambda: True,
        reports_buffered=lambda: 0,
        metrics=r.ctx.metrics,
        disk_problem=lambda: r.health.problem,
    )
    resp = await readyz(make_mocked_request("GET", "/readyz", app=app))
    return resp.status, json.loads(cast(bytes, resp.body))


# --- a root that cannot be written ----------------------------------------------------


async def test_a_claim_that_cannot_be_audited_is_handed_back_and_claiming_resumes(tmp_path: Path) -> None:
    r = rig(tmp_path)
    reconciled, stopping = asyncio.Event(), asyncio.Event()
    reconciled.set()
    r.disk.full = True
    r.queue.offers = [[task("launch", 1)]]
    loop = asyncio.create_task(r.claimer.claim_loop(reconciled=reconciled, stopping=stopping))
    try:
        await until(lambda: r.queue.released == ["task-0000000000000001"])
        # Not held (no renewal for ever), not run, and the daemon says it is not ready.
        assert r.claimer.leases.held == {} and r.claimer.work.local.empty()
        assert not r.health.ok and "audit log" in (r.health.problem or "")
        status, body = await ready_status(r)
        assert status == 503 and body["disk"] is False and "diskProblem" in body
        # While the write test fails, nothing more is claimed.
        r.queue.offers = [[task("launch", 2)]]
        await asyncio.sleep(0.3)
        assert r.queue.offers and not r.health.ok
        # Space returns: the write test passes, claiming resumes, the claim is audited.
        r.disk.full = False
        await until(lambda: "task-0000000000000002" in r.claimer.leases.held)
        assert r.health.ok and (await ready_status(r))[0] == 200
        assert r.claimer.work.local.get_nowait().task_id == "task-0000000000000002"
    finally:
        stopping.set()
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    assert verify(r.root / "audit.jsonl").ok
    claims = [ln for ln in (r.root / "audit.jsonl").read_text().splitlines() if '"claim"' in ln]
    assert len(claims) == 1 and "task-0000000000000002" in claims[0]


async def test_a_completion_the_outbox_cannot_save_hands_the_task_back(tmp_path: Path) -> None:
    r = rig(tmp_path)
    r.claimer.leases.held["task-0000000000000001"] = task("launch", 1)
    r.outbox._write = r.disk.write
    r.disk.full = True
    r.claimer.leases.complete(task_id="task-0000000000000001", ok=True)
    assert r.claimer.leases.held == {} and "task-0000000000000001" not in r.claimer.leases.completing
    assert not r.health.ok and "outbox" in (r.health.problem or "")
    await r.claimer.release_abandoned()
    assert r.queue.released == ["task-0000000000000001"]


async def test_a_workdir_that_cannot_be_created_fails_retryable_and_marks_the_root(tmp_path: Path) -> None:
    r = rig(tmp_path)
    (tmp_path / "work").write_text("a file where the workdirs go")  # mkdir fails: ENOTDIR/EEXIST
    await pods.launch(r.ctx, checked([task("launch", 1)]))
    done = r.completions()["task-0000000000000001"]
    assert done["ok"] is False and done["retryable"] is True and "workdir" in done["error"]
    assert not r.health.ok and "workdir" in (r.health.problem or "")
    assert r.applier.calls == []
    (tmp_path / "work").unlink()
    assert r.health.check() and r.health.ok


async def test_an_audit_failure_inside_a_handler_is_retryable_not_an_internal_error(tmp_path: Path) -> None:
    r = rig(tmp_path)
    reg = HandlerRegistry()
    reg.add_batch(TaskKind.LAUNCH, pods.launch)
    runner = Runner(work=r.claimer.work, registry=reg, context=r.ctx, concurrency=2, batch_max=8)
    r.disk.full = True
    await r.claimer.work.put(intake(task("launch", 1), served=(NS,)))

    async def ready() -> None:
        return None

    job = asyncio.create_task(runner.run(ready=ready))
    try:
        await until(lambda: "task-0000000000000001" in r.completions())
    finally:
        job.cancel()
        await asyncio.gather(job, return_exceptions=True)
    done = r.completions()["task-0000000000000001"]
    assert done["retryable"] is True and "audit log" in done["error"]
    assert not r.health.ok


# --- the runner refuses hostile tasks, never crashes --------------------------------------


async def test_the_runner_fails_hostile_tasks_for_good_and_runs_the_rest(tmp_path: Path) -> None:
    r = rig(tmp_path)
    deleted: list[tuple[str, str]] = []

    async def stop(ctx: TaskContext, t: CheckedTask) -> None:
        deleted.append((t.instance_id, t.kube_namespace))
        ctx.complete(task_id=t.task_id, ok=True)

    reg = HandlerRegistry()
    reg.add(TaskKind.STOP, stop, stops=TaskKind.LAUNCH)
    runner = Runner(work=r.claimer.work, registry=reg, context=r.ctx, concurrency=2, batch_max=8)
    batch = [
        task("stop", 1, instanceId="--all"),
        task("stop", 2, kubeNamespace="team-b"),
        task("stop", 3),
        task("stop", 4, spec=["x"]),
    ]
    for t in batch:
        await r.claimer.work.put(intake(t, served=(NS,)))

    async def ready() -> None:
        return None

    job = asyncio.create_task(runner.run(ready=ready))
    try:
        await until(lambda: len(r.completions()) == 4 and r.claimer.work.inflight == 0)
    finally:
        job.cancel()
        await asyncio.gather(job, return_exceptions=True)
    done = r.completions()
    assert deleted == [(iid(3), NS)]
    for n, what in ((1, "instanceId"), (2, "does not serve namespace 'team-b'"), (4, "spec")):
        item = done[f"task-{n:016x}"]
        assert item["ok"] is False and item["retryable"] is False and what in item["error"]
    assert done["task-0000000000000003"]["ok"] is True
    refused = [ln for ln in (r.root / "audit.jsonl").read_text().splitlines() if '"refuse"' in ln]
    assert len(refused) == 3


async def test_kubectl_deletes_only_a_nymph_pod_of_that_name(tmp_path: Path) -> None:
    seen: list[list[str]] = []

    class Recording(Kubectl):
        async def run(self, args: Sequence[str], *, stdin: str | None = None) -> KubectlResult:
            seen.append(list(args))
            return KubectlResult(0, f"pod/{iid(1)}\n", "")

    k = Recording(binary="kubectl")
    assert await k.delete_pod(namespace=NS, name=iid(1), grace_seconds=5)
    (args,) = seen
    # No positional name: the Pod is selected by name and nymph's label, so nothing else matches.
    assert "--selector=lakeshore=true" in args and f"--field-selector=metadata.name={iid(1)}" in args
    assert f"--namespace={NS}" in args and not any(a in ("--all", iid(1)) for a in args)
    for name, ns in (("--all", NS), ("a,b", NS), (iid(1), "--all-namespaces"), ("", NS)):
        with pytest.raises(ke.Invalid, match="refusing to delete"):
            await k.delete_pod(namespace=ns, name=name, grace_seconds=None)
    assert len(seen) == 1


async def test_a_stop_with_a_hostile_id_never_reaches_the_applier(tmp_path: Path) -> None:
    """The stop handler is given only a task that checked out as it was claimed: a hostile id
    or namespace is refused before it, and nothing reaches the applier."""
    r = rig(tmp_path)
    calls: list[str] = []

    async def delete_pod(
        *, namespace: str, name: str, grace_seconds: int | None, uid: str | None = None
    ) -> bool:
        calls.append(name)
        return True

    r.applier.delete_pod = delete_pod  # type: ignore[method-assign]
    reg = HandlerRegistry()
    reg.add(TaskKind.STOP, pods.stop, stops=TaskKind.LAUNCH)
    runner = Runner(work=r.claimer.work, registry=reg, context=r.ctx, concurrency=2, batch_max=8)
    for t in (task("stop", 1, instanceId="--all"), task("stop", 2, kubeNamespace="kube-system")):
        await r.claimer.work.put(intake(t, served=(NS,)))

    async def ready() -> None:
        return None

    job = asyncio.create_task(runner.run(ready=ready))
    try:
        await until(lambda: len(r.completions()) == 2 and r.claimer.work.inflight == 0)
    finally:
        job.cancel()
        await asyncio.gather(job, return_exceptions=True)
    assert calls == []
    done = r.completions()
    assert all(not done[f"task-{n:016x}"]["ok"] for n in (1, 2))


# --- one bad launch does not fail its batch -----------------------------------------------


def nested(depth: int) -> Any:
    value: Any = "1"
    for _ in range(depth):
        value = {"x": value}
    return value


async def test_a_launch_that_cannot_be_rendered_fails_alone_with_its_reason(tmp_path: Path) -> None:
    r = rig(tmp_path)
    bad = task("launch", 2, spec=launch_spec(2, resources={"limits": nested(900)}))
    await pods.launch(r.ctx, checked([task("launch", 1), bad, task("launch", 3)]))
    done = r.completions()
    assert r.applier.calls == [[iid(1), iid(3)]]
    assert done["task-0000000000000001"]["ok"] and done["task-0000000000000003"]["ok"]
    failed = done["task-0000000000000002"]
    assert failed["ok"] is False and failed["retryable"] is False
    # the real reason, naming the field (the spec's own depth limit catches it before the render)
    assert "spec.resources" in failed["error"] and "nested deeper" in failed["error"]
    assert "internal error" not in failed["error"]


async def test_a_batch_refused_as_a_whole_is_applied_one_by_one(tmp_path: Path) -> None:
    r = rig(tmp_path)
    r.applier.refuse_batches_with = iid(2)
    await pods.launch(r.ctx, checked([task("launch", n) for n in (1, 2, 3)]))
    done = r.completions()
    assert r.applier.calls[0] == [iid(1), iid(2), iid(3)]
    assert sorted(r.applier.calls[1:]) == [[iid(1)], [iid(2)], [iid(3)]]
    assert done["task-0000000000000001"]["ok"] and done["task-0000000000000003"]["ok"]
    assert done["task-0000000000000002"]["ok"] is False
    assert "Invalid" in done["task-0000000000000002"]["error"]


# --- adopt only this launch's Pod ----------------------------------------------------------


def pod(n: int, annotation: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": iid(n), "namespace": NS, "labels": {"lakeshore": "true"}}
    if annotation is not None:
        meta["annotations"] = {ANNOTATION_LAUNCH: annotation}
    return {"metadata": meta, "spec": {"nodeName": NODE}, "status": {"phase": "Running"}}


async def test_a_foreign_pod_with_the_launchs_name_is_a_conflict_not_adopted(tmp_path: Path) -> None:
    r = rig(tmp_path)
    (tmp_path / "work" / iid(1)).mkdir(parents=True)
    (tmp_path / "work" / iid(1) / "theirs").write_text("x")
    r.cache.cache[iid(1)] = pod(1, "someone-else")
    r.cache.cache[iid(2)] = pod(2, None)
    await pods.launch(r.ctx, checked([task("launch", 1), task("launch", 2)]))
    done = r.completions()
    for n in (1, 2):
        item = done[f"task-{n:016x}"]
        assert item["ok"] is False and item["retryable"] is False
        assert item["error"].startswith("Conflict:") and "not created for this launch" in item["error"]
    assert r.applier.calls == []
    assert (tmp_path / "work" / iid(1) / "theirs").exists()  # the other Pod's workdir stays


async def test_the_launchs_own_pod_is_adopted(tmp_path: Path) -> None:
    r = rig(tmp_path)
    first = rig(tmp_path / "first")
    await pods.launch(first.ctx, checked([task("launch", 1, spec=launch_spec(1, launchUid="u-1"))]))
    (applied,) = first.applier.applied  # the Pod applied carries the launch's identity
    assert applied["metadata"]["annotations"][ANNOTATION_LAUNCH] == "u-1"
    r.cache.cache[iid(1)] = pod(1, "u-1")
    await pods.launch(r.ctx, checked([task("launch", 1, spec=launch_spec(1, launchUid="u-1"))]))
    done = r.completions()["task-0000000000000001"]
    assert done["ok"] and done["result"]["adopted"] is True
    assert r.applier.calls == []


async def test_an_apply_clash_with_a_foreign_pod_is_not_adopted(tmp_path: Path) -> None:
    r = rig(tmp_path)
    r.applier.errors = {iid(1): [ke.AlreadyExists("exists")], iid(2): [ke.AlreadyExists("exists")]}
    r.cache.cache[iid(1)] = pod(1, "foreign")
    real = r.applier.apply

    async def apply_then_cache(
        ms: Sequence[Mapping[str, Any]], *, dry_run: bool = False
    ) -> list[ApplyOutcome]:
        out = await real(ms, dry_run=dry_run)
        # The Pod shows up in the watch while the apply runs: one ours (a redelivery), one not.
        for m in ms:
            name = object_key(m)[1]
            if name == iid(2):
                r.cache.cache[name] = {**pod(2, None), "metadata": dict(m["metadata"])}
        return out

    r.cache.cache.pop(iid(1))
    r.applier.apply = apply_then_cache  # type: ignore[method-assign]

    async def foreign_appears(
        ms: Sequence[Mapping[str, Any]], *, dry_run: bool = False
    ) -> list[ApplyOutcome]:
        r.cache.cache[iid(1)] = pod(1, "foreign")
        return await apply_then_cache(ms, dry_run=dry_run)

    r.applier.apply = foreign_appears  # type: ignore[method-assign]
    await pods.launch(r.ctx, checked([task("launch", 1), task("launch", 2)]))
    done = r.completions()
    assert done["task-0000000000000001"]["ok"] is False
    assert done["task-0000000000000001"]["error"].startswith("Conflict:")
    assert done["task-0000000000000002"]["ok"] and done["task-0000000000000002"]["result"]["adopted"]


async def test_reports_the_outbox_cannot_save_are_kept_and_written_in_order_later(tmp_path: Path) -> None:
    r = rig(tmp_path)
    tracker = Tracker(
        node=NODE, outbox=r.outbox, metrics=r.ctx.metrics, workdirs=r.ctx.workdirs, disk=r.health
    )
    r.outbox._write = r.disk.write
    r.disk.full = True
    track = tracker.track(iid(1), namespace=NS)
    tracker.report(iid(1), track, Report(InstanceState.RUNNING, None, "running"))
    tracker.report(iid(1), track, Report(InstanceState.STOPPED, Reason.COMPLETED, "done"))
    assert not r.health.ok and len(tracker.unsaved) == 2
    assert not [i for i in r.outbox.mem if i["kind"] == "report"]
    r.disk.full = False
    assert r.health.check()  # the write test passes: the kept reports go out, oldest first
    states = [i["state"] for i in r.outbox.mem if i["kind"] == "report"]
    assert states == ["running", "stopped"] and tracker.unsaved == []
