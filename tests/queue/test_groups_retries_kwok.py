"""Groups and retries on the real API server (a kwok node, a real queue and daemon process),
with kills.

A group stopped while the daemon is applying its Pods, the daemon killed with SIGKILL in the
middle and restarted, the stop sent twice: every member ends stopped, and no Pod of the group is
left in the cluster (counted by the group label), whichever launches were applied before, during
or after the stop.

Failing launches with a retry policy, the daemon killed while their Pods fail (it reports the
failures after its restart) and the queue killed right after: every launch gets exactly the
attempts its policy allows, one Pod each, never a second retry of one attempt.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nymph.client import UserClient
from nymph.localcluster import LocalCluster
from tests.support.stack import FaultStack, running_stack

pytestmark = [pytest.mark.e2e]

MEMBERS = 30


@pytest.fixture
def stack(kube: LocalCluster, namespace: str, tmp_path: Path) -> Iterator[FaultStack]:
    yield from running_stack(kube, namespace, tmp_path, extra=("--reap-after", "2", "--concurrency", "4"))


def _group_pods(stack: FaultStack, group_id: str) -> list[str]:
    found = stack.kube.api(
        "GET", f"/api/v1/namespaces/{stack.namespace}/pods?labelSelector=nymph.io%2Fgroup%3D{group_id}"
    )["items"]
    return [p["metadata"]["name"] for p in found]


async def _until(what: str, check: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not await check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.2)


async def test_a_group_stopped_while_applied_and_across_a_daemon_kill_leaves_no_pod(
    stack: FaultStack,
) -> None:
    q = stack.queue
    async with UserClient(base_url=q.url, token=q.user_token, timeout=20) as c:
        body = {"mode": "py", "script": "print(1)", "count": MEMBERS, "tags": {"sim.nymph.io/run": "1h"}}
        gid = (await c.launch_group(provider="local", body=body))["groupId"]

        async def some_applied() -> bool:
            return len(_group_pods(stack, gid)) >= 3

        await _until("the first Pods of the group", some_applied, 60)
        counts = (await c.get_group(group_id=gid))["counts"]
        assert counts.get("queued", 0) > 0, counts  # the stop meets launches not applied yet
        stack.kill_daemon()
        await c.stop_group(group_id=gid)
        stack.restart_daemon()
        await c.stop_group(group_id=gid)  # again: nothing more to do, no error

        async def all_stopped() -> bool:
            return (await c.get_group(group_id=gid))["counts"] == {"stopped": MEMBERS}

        await _until("every member stopped", all_stopped, 90)
        group = await c.get_group(group_id=gid)
        assert group["reasons"] == {"Stopped": MEMBERS}

        async def no_pods() -> bool:
            return not _group_pods(stack, gid)

        await _until("no Pod of the group left", no_pods, 60)
        await asyncio.sleep(3)  # a late apply would show up by now
        assert _group_pods(stack, gid) == []
    assert not stack.failed_restarts


async def test_a_retry_is_made_once_per_attempt_across_daemon_and_queue_kills(stack: FaultStack) -> None:
    q = stack.queue
    launches = 4
    retry = {"limit": 1, "on": ["Error"], "backoff": "0s"}
    tags = {"sim.nymph.io/outcome": "fail", "sim.nymph.io/run": "2s"}
    body = {"mode": "py", "script": "print(1)", "count": launches, "tags": tags, "fields": {"retry": retry}}
    async with UserClient(base_url=q.url, token=q.user_token, timeout=20) as c:
        gid = (await c.launch_group(provider="local", body=body))["groupId"]

        async def all_running() -> bool:
            return (await c.get_group(group_id=gid))["counts"].get("running", 0) == launches

        await _until("the first attempts running", all_running, 60)
        stack.kill_daemon()  # their Pods fail while no daemon watches them
        await asyncio.sleep(4)
        stack.restart_daemon()  # it finds them failed and reports it

        async def some_reported() -> bool:
            return (await c.get_group(group_id=gid))["counts"].get("running", 0) < launches

        await _until("a failure reported", some_reported, 60)
        stack.kill_queue()  # mid-way through the reports: the daemon sends them again
        stack.restart_queue()

        async def chains_done() -> bool:
            members = await c.group_instances(group_id=gid)
            return len(members) == 2 * launches and all(m["state"] == "stopped" for m in members)

        await _until("every attempt stopped", chains_done, 120)
        await asyncio.sleep(2)  # a second retry of an attempt would show up by now
        members = await c.group_instances(group_id=gid)
    assert len(members) == 2 * launches, [(m["groupIndex"], m.get("attempt")) for m in members]
    for index in range(launches):
        first, second = (m for m in members if m["groupIndex"] == index)
        assert (first["attempt"], second["attempt"]) == (1, 2)
        assert first["retriedAs"] == second["instanceId"] and second["retryOf"] == first["instanceId"]
        assert "retriedAs" not in second and second["reason"] == "Error"
        assert "limit of 1 retries is reached" in second["history"][-1]["message"]
    # the daemon's claim of each retry names the attempt it retries
    retried = {
        r["instance"]: r["retry_of"]
        for r in stack.audit_records()
        if r["action"] == "claim" and "retry_of" in r
    }
    assert retried == {m["instanceId"]: m["retryOf"] for m in members if m["attempt"] == 2}
    assert not stack.failed_restarts
