"""The daemon's handler registry and runner, and the apply retry policy (no cluster)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import pytest

from nymph.client import QueueClient
from nymph.daemon.audit import AuditLog
from nymph.daemon.claimer import Claimer
from nymph.daemon.daemon import default_handlers
from nymph.daemon.diskhealth import DiskHealth
from nymph.daemon.leases import LeaseLedger
from nymph.daemon.metrics import Metrics
from nymph.daemon.outbox import Outbox
from nymph.daemon.runner import HandlerKey, HandlerRegistry, Runner, UnknownTaskKind
from nymph.daemon.settings import DaemonSettings
from nymph.daemon.tasks import dockyard, pods
from nymph.daemon.tasks.apply import APPLY_RETRY, RetryPolicy, apply_all, apply_each
from nymph.daemon.tasks.context import TaskContext
from nymph.daemon.tasks.validate import CheckedTask, intake
from nymph.daemon.tracker import Tracker
from nymph.daemon.workdirs import Workdirs
from nymph.daemon.workqueue import WorkQueue
from nymph.errors import ConfigError, NymphError
from nymph.kube import errors as ke
from nymph.kube.applier import ApplyOutcome, object_key
from nymph.kube.kubectl import Kubectl
from nymph.protocol import TaskJSON, TaskKind

IID = "lakeshore-0000000a"


def task(kind: str, tid: str = "t1", spec: dict[str, Any] | None = None) -> TaskJSON:
    if spec is None and kind in ("launch", "probe"):
        spec = {"instanceId": IID, "namespace": "jobs"}
    return cast(
        TaskJSON,
        {
            "taskId": tid,
            "kind": kind,
            "instanceId": IID,
            "namespace": "team",
            "kubeNamespace": "jobs",
            "spec": spec,
        },
    )


# --- registry ----------------------------------------------------------------------------------


def test_the_default_registry_has_a_handler_for_every_kind() -> None:
    reg = default_handlers()
    assert reg.lookup(task("launch")).batched
    assert reg.lookup(task("probe")).key == HandlerKey(TaskKind.PROBE)
    assert reg.lookup(task("dockyard")).key == HandlerKey(TaskKind.DOCKYARD)
    assert reg.lookup(task("stop")).key == HandlerKey(TaskKind.STOP, TaskKind.LAUNCH)
    dock_stop = task("stop", spec={"dockyard": {"recipe": {}}})
    assert reg.lookup(dock_stop).key == HandlerKey(TaskKind.STOP, TaskKind.DOCKYARD)


def test_an_unknown_kind_is_a_clear_failure() -> None:
    with pytest.raises(UnknownTaskKind, match="unknown task kind 'reboot'"):
        default_handlers().lookup(task("reboot"))
    empty = HandlerRegistry()
    with pytest.raises(UnknownTaskKind, match="unknown task kind 'probe'"):
        empty.lookup(task("probe"))
    empty.add(TaskKind.STOP, pods.stop, stops=TaskKind.LAUNCH)
    with pytest.raises(UnknownTaskKind, match="'stop of dockyard'"):
        empty.lookup(task("stop", spec={"dockyard": {}}))


def test_a_kind_is_registered_once() -> None:
    reg = HandlerRegistry()
    reg.add(TaskKind.DOCKYARD, dockyard.launch)
    with pytest.raises(NymphError, match="registered already"):
        reg.add(TaskKind.DOCKYARD, dockyard.launch)


def test_batched_kinds_are_grouped_and_the_rest_run_one_by_one() -> None:
    batch = [
        task("stop", "s1"),
        task("launch", "l1"),
        task("nope", "x"),
        task("launch", "l2"),
        task("probe", "p"),
    ]
    groups, unknown = default_handlers().group(batch)
    assert [[t["taskId"] for t in ts] for _, ts in groups] == [["l1", "l2"], ["s1"], ["p"]]
    assert [(t["taskId"], str(e)) for t, e in unknown] == [("x", "unknown task kind 'nope'")]


async def test_the_runner_fails_unknown_kinds_for_good_and_runs_the_rest(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "state")
    metrics = Metrics()
    audit = AuditLog(tmp_path / "audit.jsonl")
    settings = DaemonSettings(daemon_id="d1", node="node-a")
    leases = LeaseLedger(outbox=outbox, disk=DiskHealth())
    claimer = Claimer(
        settings=settings,
        client=QueueClient(base_url="http://127.0.0.1:9"),
        leases=leases,
        work=WorkQueue(leases=leases, metrics=metrics, in_flight=settings.in_flight),
        audit=audit,
        metrics=metrics,
    )
    workdirs = Workdirs(root=tmp_path)
    kubectl = Kubectl()
    ctx = TaskContext(
        applier=kubectl,
        kubectl=kubectl,
        tracker=Tracker(node="node-a", outbox=outbox, metrics=metrics, workdirs=workdirs),
        complete=claimer.leases.complete,
        audit=audit,
        metrics=metrics,
        workdirs=workdirs,
        namespaces=("jobs",),
        node="node-a",
        daemon_id="d1",
        workdir_root=tmp_path,
        delete_grace_seconds=None,
        stopping=asyncio.Event(),
    )
    ran: list[str] = []

    async def echo(ctx: TaskContext, t: CheckedTask) -> None:
        ran.append(t.task_id)
        ctx.complete(task_id=t.task_id, ok=True)

    reg = HandlerRegistry()
    reg.add(TaskKind.PROBE, echo)
    runner = Runner(work=claimer.work, registry=reg, context=ctx, concurrency=2, batch_max=8)
    for t in (task("probe", "p1"), task("reboot", "r1"), task("probe", "p2")):
        await claimer.work.put(intake(t, served=("jobs",)))

    async def ready() -> None:
        return None

    job = asyncio.create_task(runner.run(ready=ready))
    for _ in range(100):
        if len(claimer.leases.completing) == 3 and claimer.work.inflight == 0:
            break
        await asyncio.sleep(0.01)
    job.cancel()
    await asyncio.gather(job, return_exceptions=True)
    done = {i["taskId"]: i for i in outbox.mem if i["kind"] == "complete"}
    assert sorted(ran) == ["p1", "p2"]
    assert done["r1"]["ok"] is False and done["r1"]["retryable"] is False
    assert done["r1"]["error"] == "unknown task kind 'reboot'"
    assert done["p1"]["ok"] and done["p2"]["ok"]
    assert (
        claimer.work.inflight == 0 and claimer.work.capacity() == settings.in_flight + claimer.work.prefetch
    )


# --- retry policy --------------------------------------------------------------------------------


def test_the_policy_is_bounded_and_backs_off_exponentially() -> None:
    p = RetryPolicy(attempts=4, base_delay=0.5, max_delay=1.5)
    assert [p.again(a) for a in (1, 2, 3, 4)] == [True, True, True, False]
    assert [p.delay(a, jitter=0) for a in (1, 2, 3)] == [0.5, 1.0, 1.5]  # capped
    assert p.delay(2, jitter=1) == 2.0 and p.delay(2, jitter=7) == 2.0  # jitter adds at most 100%
    assert (APPLY_RETRY.attempts, APPLY_RETRY.base_delay) == (3, 0.5)


@pytest.mark.parametrize(
    "kw", [{"attempts": 0}, {"attempts": 1000}, {"base_delay": -1}, {"base_delay": 5, "max_delay": 1}]
)
def test_an_unbounded_policy_is_refused(kw: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        RetryPolicy(**kw)


class ScriptedApplier:
    """An :class:`~nymph.kube.applier.Applier` answering from a script: name -> errors per call."""

    name = "scripted"

    def __init__(self, script: dict[str, list[ke.KubeError | None]]) -> None:
        self.script = script
        self.calls: list[list[str]] = []

    async def apply(
        self, manifests: Sequence[Mapping[str, Any]], *, dry_run: bool = False
    ) -> list[ApplyOutcome]:
        names = [object_key(m)[1] for m in manifests]
        self.calls.append(names)
        return [
            ApplyOutcome("jobs", n, error=self.script[n].pop(0) if self.script[n] else None) for n in names
        ]

    async def delete_pod(
        self, *, namespace: str, name: str, grace_seconds: int | None, uid: str | None = None
    ) -> bool:
        raise AssertionError("not used")

    async def pod_logs(self, *, namespace: str, name: str, limit_bytes: int) -> str:
        raise AssertionError("not used")

    async def can_i(self, *, verb: str, resource: str, namespace: str) -> bool:
        return True


def manifests(*names: str) -> list[dict[str, Any]]:
    return [{"kind": "Pod", "metadata": {"name": n, "namespace": "jobs"}} for n in names]


FAST = RetryPolicy(attempts=3, base_delay=0.0, max_delay=0.0)


async def test_apply_each_retries_only_transient_failures_and_settles_each_once() -> None:
    applier = ScriptedApplier(
        {
            "ok": [],
            "flaky": [ke.Unavailable("down")],
            "bad": [ke.Invalid("no")],
            "down": [ke.Throttled("x")] * 5,
        }
    )
    settled: dict[str, str] = {}

    def settle(i: int, o: ApplyOutcome) -> None:
        assert o.name not in settled
        settled[o.name] = "ok" if o.error is None else type(o.error).__name__

    await apply_each(
        applier=applier,
        manifests=manifests("ok", "flaky", "bad", "down"),
        metrics=Metrics(),
        policy=FAST,
        retry=lambda i, o: o.error is not None and o.error.transient,
        settle=settle,
    )
    assert applier.calls == [["ok", "flaky", "bad", "down"], ["flaky", "down"], ["down"]]
    assert settled == {"ok": "ok", "bad": "Invalid", "flaky": "ok", "down": "Throttled"}


async def test_apply_all_repeats_everything_while_every_failure_is_transient() -> None:
    applier = ScriptedApplier({"a": [], "b": [ke.Conflict("c"), None]})
    outcomes = await apply_all(applier=applier, manifests=manifests("a", "b"), metrics=Metrics(), policy=FAST)
    assert applier.calls == [["a", "b"], ["a", "b"]] and all(o.ok for o in outcomes)
    applier = ScriptedApplier({"a": [ke.Conflict("c")], "b": [ke.Forbidden("f")]})
    outcomes = await apply_all(applier=applier, manifests=manifests("a", "b"), metrics=Metrics(), policy=FAST)
    assert applier.calls == [["a", "b"]]  # a permanent failure: no second attempt
    assert isinstance(outcomes[1].error, ke.Forbidden)
