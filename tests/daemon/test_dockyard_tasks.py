"""The pure parts of the daemon's dockyard task handling: spec checks, object naming."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from nymph.daemon.runner import HandlerKey
from nymph.daemon.tasks.dockyard import DockyardObject, render
from nymph.daemon.tasks.validate import CheckedTask
from nymph.dockyard.errors import DockyardConfigError
from nymph.launch.render import manifest_sha256
from nymph.protocol import TaskJSON, TaskKind

EXAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "examples"
SPEC: dict[str, Any] = {
    "recipe": yaml.safe_load((EXAMPLES / "dockyard-grpo-vllm.yaml").read_text()),
    "infra": yaml.safe_load((EXAMPLES / "dockyard-grpo-vllm.infra.yaml").read_text()),
    "overrides": [],
    "namespace": "jobs",
}


def test_render_gives_the_objects_in_apply_order_in_the_task_namespace() -> None:
    manifests = render(SPEC, namespace="jobs")
    assert [m["kind"] for m in manifests] == [
        "Deployment",
        "Service",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "RayJob",
    ]
    assert {m["metadata"]["namespace"] for m in manifests} == {"jobs"}
    assert render(SPEC, namespace="jobs") == manifests  # deterministic: a redelivery re-applies the same


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        (None, "no dockyard spec"),
        ({**SPEC, "recipe": None}, "recipe"),
        ({**SPEC, "infra": ["x"]}, "infra"),
        ({**SPEC, "overrides": "a=b"}, "overrides"),
        ({**SPEC, "overrides": [1]}, "overrides"),
        ({**SPEC, "namespace": "other"}, "namespace"),
        ({**SPEC, "infra": {**SPEC["infra"], "colour": 1}}, "infra.colour"),
    ],
)
def test_render_refuses_a_bad_spec(spec: object, needle: str) -> None:
    with pytest.raises(DockyardConfigError, match=needle):
        render(spec, namespace="jobs")


def test_objects_are_named_as_kubectl_prints_them() -> None:
    by_kind = {m["kind"]: DockyardObject.of(m) for m in render(SPEC, namespace="jobs")}
    assert by_kind["Deployment"].printed_name == "deployment.apps/dockyard-sandbox"
    assert by_kind["Service"].printed_name == "service/dockyard-sandbox"
    assert by_kind["NetworkPolicy"].printed_name == "networkpolicy.networking.k8s.io/dockyard-sandbox-netpol"
    assert by_kind["PodDisruptionBudget"].printed_name == "poddisruptionbudget.policy/dockyard-sandbox-pdb"
    assert by_kind["RayJob"].printed_name == "rayjob.ray.io/dockyard-grpo-vllm"
    assert by_kind["RayJob"].ref == "RayJob/dockyard-grpo-vllm"
    deployment = render(SPEC, namespace="jobs")[0]
    assert by_kind["Deployment"].to_json() == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "namespace": "jobs",
        "name": "dockyard-sandbox",
        "manifestSha256": manifest_sha256(deployment),
    }


def is_dockyard_stop(task: dict[str, Any]) -> bool:
    return HandlerKey.of(cast(TaskJSON, task)) == HandlerKey(TaskKind.STOP, TaskKind.DOCKYARD)


def test_stop_tasks_of_dockyard_instances_are_told_apart() -> None:
    assert is_dockyard_stop({"kind": "stop", "spec": {"dockyard": SPEC}})
    assert not is_dockyard_stop({"kind": "stop", "spec": None})
    assert not is_dockyard_stop({"kind": "stop"})


# -- rollback of a launch that fails for good ------------------------------------------------------


class _FlakyKubectl:
    """Applies everything but the RayJob, which the API server keeps throttling; answers gets
    with what it applied; deletes what it is asked to (by API path, with a uid precondition)."""

    name = "kubectl"

    def __init__(self) -> None:
        self.applied: dict[str, dict[str, Any]] = {}
        self.deleted: list[str] = []

    async def apply(self, manifests: Any, *, dry_run: bool = False) -> list[Any]:
        from nymph.kube.applier import ApplyOutcome, object_key
        from nymph.kube.errors import Throttled

        outcomes = []
        for m in manifests:
            if m["kind"] == "RayJob":
                outcomes.append(ApplyOutcome(*object_key(m), error=Throttled("slow down")))
                continue
            live = {**m, "metadata": {**m["metadata"], "uid": f"uid-{m['kind']}"}}
            self.applied[DockyardObject.of(m).printed_name] = live
            outcomes.append(ApplyOutcome(*object_key(m), obj=live))
        return outcomes

    async def run(self, args: Any, *, stdin: str | None = None) -> Any:
        from nymph.kube.kubectl import KubectlResult

        if args[0] == "get":
            items = [self.applied[a] for a in args if a in self.applied]
            return KubectlResult(0, json.dumps({"kind": "List", "items": items}), "")
        assert args[:2] == ["delete", "--raw"] and json.loads(stdin or "")["preconditions"]["uid"]
        self.deleted.append(args[2])
        return KubectlResult(0, "{}", "")


def _task_context(tmp_path: Path, kubectl: _FlakyKubectl, completions: list[dict[str, Any]]) -> Any:
    import asyncio

    from nymph.daemon.audit import AuditLog
    from nymph.daemon.metrics import Metrics
    from nymph.daemon.outbox import Outbox
    from nymph.daemon.tasks.context import TaskContext
    from nymph.daemon.tracker import Tracker
    from nymph.daemon.workdirs import Workdirs

    metrics = Metrics()
    workdirs = Workdirs(root=tmp_path)
    outbox = Outbox(tmp_path / "state")
    return TaskContext(
        applier=cast(Any, kubectl),
        kubectl=cast(Any, kubectl),
        tracker=Tracker(node="n1", outbox=outbox, metrics=metrics, workdirs=workdirs),
        complete=lambda **kw: completions.append(kw),
        audit=AuditLog(tmp_path / "audit.jsonl"),
        metrics=metrics,
        workdirs=workdirs,
        namespaces=("jobs",),
        node="n1",
        daemon_id="d1",
        workdir_root=tmp_path,
        delete_grace_seconds=None,
        stopping=asyncio.Event(),
    )


@pytest.mark.parametrize(
    ("attempt", "max_attempts", "rolled_back"), [(1, None, False), (5, None, True), (2, 2, True)]
)
async def test_the_last_retryable_attempt_is_rolled_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, attempt: int, max_attempts: int | None, rolled_back: bool
) -> None:
    from nymph.daemon.tasks import apply as apply_mod
    from nymph.daemon.tasks import dockyard as handler

    monkeypatch.setattr(handler, "apply_all", _single_apply(apply_mod))
    kubectl = _FlakyKubectl()
    completions: list[dict[str, Any]] = []
    ctx = _task_context(tmp_path, kubectl, completions)
    task: dict[str, Any] = {
        "taskId": "t1",
        "instanceId": "lakeshore-0000aaaa",
        "kubeNamespace": "jobs",
        "spec": SPEC,
        "attempt": attempt,
    }
    if max_attempts is not None:
        task["maxAttempts"] = max_attempts
    await handler.launch(ctx, checked_dockyard(task))
    (done,) = completions
    assert done["ok"] is False and done["retryable"] is True
    # what was applied (all but the RayJob), deleted in reverse order by its API path
    expected = [
        "/apis/policy/v1/namespaces/jobs/poddisruptionbudgets/dockyard-sandbox-pdb",
        "/apis/networking.k8s.io/v1/namespaces/jobs/networkpolicies/dockyard-sandbox-netpol",
        "/api/v1/namespaces/jobs/services/dockyard-sandbox",
        "/apis/apps/v1/namespaces/jobs/deployments/dockyard-sandbox",
    ]
    assert kubectl.deleted == (expected if rolled_back else [])
    assert ("rolled back" in done["error"]) is rolled_back


def checked_dockyard(task: dict[str, Any]) -> CheckedTask:
    """A dockyard task of namespace ``jobs`` as the claimer checked it: what the handler receives."""
    return CheckedTask(
        task["taskId"], TaskKind.DOCKYARD, task["instanceId"], "team", "jobs", cast(TaskJSON, task)
    )


def _single_apply(apply_mod: Any) -> Any:
    async def once(**kw: Any) -> Any:
        return await apply_mod.apply_all(**kw, policy=apply_mod.RetryPolicy(attempts=1))

    return once


def test_the_default_attempts_are_the_queues() -> None:
    from nymph.daemon.tasks.dockyard import QUEUE_MAX_ATTEMPTS
    from nymph.queue.models import RetrySettings

    assert RetrySettings().max_attempts == QUEUE_MAX_ATTEMPTS


async def test_a_spec_the_pod_policy_refuses_is_never_applied_by_the_daemon(tmp_path: Path) -> None:
    """The queue refuses such a spec before it is queued; one that reached the daemon anyway
    fails for good with the field named, and nothing is read, applied or deleted."""
    from nymph.daemon.tasks import dockyard as handler

    infra = yaml.safe_load((EXAMPLES / "dockyard-grpo-vllm.infra.yaml").read_text())
    infra["kuberay"]["spec"]["headGroupSpec"]["template"]["spec"]["hostPID"] = True
    kubectl = _FlakyKubectl()
    calls: list[Any] = []
    original_run = kubectl.run

    async def run(args: Any, *, stdin: str | None = None) -> Any:
        calls.append(args)
        return await original_run(args, stdin=stdin)

    kubectl.run = run  # type: ignore[method-assign]
    completions: list[dict[str, Any]] = []
    ctx = _task_context(tmp_path, kubectl, completions)
    task = {
        "taskId": "t1",
        "instanceId": "lakeshore-0000aaaa",
        "kubeNamespace": "jobs",
        "spec": {**SPEC, "infra": infra},
    }
    await handler.launch(ctx, checked_dockyard(task))
    (done,) = completions
    assert done["ok"] is False and done["retryable"] is False
    assert (
        "headGroupSpec.template.spec.hostPID: sharing the host's namespaces is not allowed" in done["error"]
    )
    assert calls == [] and kubectl.applied == {} and kubectl.deleted == []
