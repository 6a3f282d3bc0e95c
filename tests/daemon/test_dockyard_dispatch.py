"""A dockyard launch dispatched through the real queue to the real daemon, against the real API
server with the KubeRay CRDs installed.

The daemon authenticates as a ServiceAccount bound to the Role in manifests/base/daemon-role.yaml
plus the one in manifests/base/daemon-dockyard-role.yaml, so these tests prove that pair
sufficient; without the dockyard Role the launch fails with the API server's Forbidden.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from nymph.dockyard.ownership import LAUNCH_LABEL, mark
from nymph.dockyard.render.task import dockyard_task_manifests
from nymph.launch.render import manifest_sha256
from nymph.localcluster import LocalCluster
from tests.support.harness import REPO, DaemonProc, QueueProc, daemon_kubeconfig, nymph, wait_state

pytestmark = pytest.mark.e2e

RECIPE = REPO / "manifests" / "examples" / "dockyard-grpo-vllm.yaml"
INFRA = REPO / "manifests" / "examples" / "dockyard-grpo-vllm.infra.yaml"


@dataclass
class Stack:
    kube: LocalCluster
    namespace: str
    queue: QueueProc
    daemon: DaemonProc
    tmp: Path

    def env(self) -> dict[str, str]:
        return self.queue.user_env()


@pytest.fixture
def stack(
    kube: LocalCluster, namespace: str, kuberay_crds: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Stack]:
    """Queue + daemon; the daemon has the dockyard Role unless the test is parametrized False."""
    with_dockyard_role, *extra = getattr(request, "param", (True,))
    # the example infra runs its pods as this ServiceAccount: the operator allows it
    q = QueueProc(tmp_path / "queue.db", extra=("--service-account", "default=dockyard-rl"))
    q.tokens()
    q.start()
    kc = daemon_kubeconfig(kube, namespace, tmp_path, dockyard=with_dockyard_role)
    d = DaemonProc(q, kc, namespace, tmp_path / "root", extra=tuple(extra))

    async def provider() -> None:
        async with q.client() as c:
            await c.create_provider(
                name="local", launcher="Kube", kwargs={"namespace": namespace}, dispatch="daemon"
            )

    asyncio.run(provider())
    d.start()
    try:
        yield Stack(kube, namespace, q, d, tmp_path)
    finally:
        d.kill()
        q.kill()


def expected(namespace: str, overrides: list[str]) -> list[dict[str, Any]]:
    """What the daemon must apply: the example rendered for the test namespace."""
    return dockyard_task_manifests(
        recipe=yaml.safe_load(RECIPE.read_text()),
        infra=yaml.safe_load(INFRA.read_text()),
        overrides=overrides,
        namespace=namespace,
    )


def ref(manifest: dict[str, Any]) -> str:
    group = manifest["apiVersion"].rpartition("/")[0]
    return f"{manifest['kind'].lower()}{'.' + group if group else ''}/{manifest['metadata']['name']}"


def present(kube: LocalCluster, namespace: str, manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The objects of ``manifests`` that exist in the cluster (as the admin sees them)."""
    res = kube.kubectl(
        "get",
        "-n",
        namespace,
        "--ignore-not-found",
        "--show-managed-fields",
        "-o",
        "json",
        *(ref(m) for m in manifests),
    )
    if not res.stdout.strip():
        return []
    doc = json.loads(res.stdout)
    return list(doc["items"]) if doc.get("kind") == "List" else [doc]


def audit(stack: Stack) -> list[dict[str, Any]]:
    path = stack.daemon.root / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def test_dockyard_launch_is_applied_in_order_then_stopped(stack: Stack) -> None:
    overrides = ["infra.sandbox.replicas=2"]
    manifests = expected(stack.namespace, overrides)
    kinds = [m["kind"] for m in manifests]
    assert kinds == ["Deployment", "Service", "NetworkPolicy", "PodDisruptionBudget", "RayJob"]

    res = await asyncio.to_thread(
        nymph,
        "launch-dockyard",
        "local",
        str(RECIPE),
        "--infra",
        str(INFRA),
        "--set",
        overrides[0],
        "--wait",
        env=stack.env(),
    )
    assert res.returncode == 0, res.stdout + res.stderr
    iid = res.stdout.strip().splitlines()[0]
    for state in ("queued", "starting", "running"):
        assert state in res.stderr
    inst = await wait_state(stack.queue, iid, {"running"})
    assert inst["node"] is None and inst["kubeNamespace"] == stack.namespace
    assert "5 objects applied" in inst["message"]

    live = present(stack.kube, stack.namespace, manifests)
    assert sorted((o["kind"], o["metadata"]["name"]) for o in live) == sorted(
        (m["kind"], m["metadata"]["name"]) for m in manifests
    )
    by_kind = {o["kind"]: o for o in live}
    assert by_kind["Deployment"]["spec"]["replicas"] == 2
    assert by_kind["RayJob"]["metadata"]["labels"]["nymph.io/managed-by"] == "nymph"
    assert by_kind["RayJob"]["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "dockyard-k8s"
    assert {o["metadata"]["labels"][LAUNCH_LABEL] for o in live} == {iid}  # each marked as this launch's
    for obj in live:
        managers = {f["manager"] for f in obj["metadata"]["managedFields"] if f["operation"] == "Apply"}
        assert managers == {"nymph"}  # server-side applied by the daemon

    applied = [r for r in audit(stack) if r["action"] == "apply" and r.get("instance") == iid]
    assert [(r["kind"], r["name"], r["result"]) for r in applied] == [
        (m["kind"], m["metadata"]["name"], "ok") for m in manifests
    ]
    assert [r["manifest_sha256"] for r in applied] == [
        manifest_sha256(m) for m in mark(manifests, launch=iid)
    ]

    async with stack.queue.client() as c:
        await c.stop(provider="local", instance_id=iid)
    inst = await wait_state(stack.queue, iid, {"stopped"})
    assert inst["reason"] == "Stopped"
    assert present(stack.kube, stack.namespace, manifests) == []
    deleted = [r for r in audit(stack) if r["action"] == "delete" and r.get("instance") == iid]
    assert [(r["kind"], r["result"]) for r in deleted] == [(k, "deleted") for k in reversed(kinds)]
    verify = await asyncio.to_thread(nymph, "audit", "verify", str(stack.daemon.root / "audit.jsonl"))
    assert verify.returncode == 0, verify.stdout + verify.stderr


@pytest.mark.parametrize("stack", [(False, "--apply-with", "api")], indirect=True)
async def test_without_the_dockyard_role_the_launch_fails_forbidden(stack: Stack) -> None:
    """The pod Role alone does not cover dockyard kinds: a permanent failure with the API
    server's message, no retries, nothing left behind (also under ``--apply-with api``: dockyard
    tasks always go through kubectl)."""
    async with stack.queue.client() as c:
        accepted = await c.launch_dockyard(
            provider="local",
            recipe=yaml.safe_load(RECIPE.read_text()),
            infra=yaml.safe_load(INFRA.read_text()),
        )
    iid = accepted["instanceId"]
    inst = await wait_state(stack.queue, iid, {"stopped"})
    assert inst["reason"] == "LaunchFailed"
    assert "Forbidden" in inst["message"] and "is forbidden" in inst["message"]
    assert "system:serviceaccount:" in inst["message"]
    assert present(stack.kube, stack.namespace, expected(stack.namespace, [])) == []
    records = [r for r in audit(stack) if r.get("instance") == iid]
    claims = [r for r in records if r["action"] == "claim"]
    assert len(claims) == 1  # permanent: not handed out again
    applies = [r for r in records if r["action"] == "apply"]
    assert applies and all(r["result"] == "failed" and "Forbidden" in r["error"] for r in applies)


async def test_a_rayjobs_end_stops_the_instance_with_its_reason(stack: Stack) -> None:
    """When KubeRay marks a launch's RayJob Failed, the daemon reports the instance stopped with
    reason Error and KubeRay's message, deletes the sandbox pool (audited), and keeps the
    RayJob, whose status stays readable."""
    manifests = expected(stack.namespace, [])
    async with stack.queue.client() as c:
        accepted = await c.launch_dockyard(
            provider="local",
            recipe=yaml.safe_load(RECIPE.read_text()),
            infra=yaml.safe_load(INFRA.read_text()),
        )
    iid = accepted["instanceId"]
    await wait_state(stack.queue, iid, {"running"})
    rayjob = next(m for m in manifests if m["kind"] == "RayJob")["metadata"]["name"]
    status = {
        "jobDeploymentStatus": "Failed",
        "jobStatus": "FAILED",
        "reason": "AppFailed",
        "message": "exit 3",
    }
    stack.kube.api(
        "PATCH",
        f"/apis/ray.io/v1/namespaces/{stack.namespace}/rayjobs/{rayjob}/status",
        {"status": status},
        content_type="application/merge-patch+json",
    )
    inst = await wait_state(stack.queue, iid, {"stopped"})
    assert inst["reason"] == "Error"
    assert inst["message"] == f"RayJob {rayjob} failed (job FAILED): exit 3"
    assert [o["kind"] for o in present(stack.kube, stack.namespace, manifests)] == ["RayJob"]
    deleted = [r for r in audit(stack) if r["action"] == "delete" and r.get("instance") == iid]
    assert sorted((r["kind"], r["result"]) for r in deleted) == sorted(
        (m["kind"], "rayjob-ended") for m in manifests if m["kind"] != "RayJob"
    )
