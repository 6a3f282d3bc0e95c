"""A launch group's stop racing with its launches being applied, on the real API server (a kwok
node, a real queue and daemon process): the group is stopped while the daemon is applying its
Pods, the daemon is killed with SIGKILL in the middle and restarted, and the stop is sent twice.

It guards that every member ends stopped, and that no Pod of the group is left in the cluster
(counted by the group label), whichever launches were applied before, during or after the stop.
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
