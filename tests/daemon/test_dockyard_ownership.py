"""A dockyard launch applies and deletes only its own objects, against the real API server: a
name taken by an administrator's object (or another launch's) fails the launch with a message
naming it, and that object is left exactly as it was."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import yaml

from tests.daemon.test_dockyard_dispatch import INFRA, RECIPE, Stack, audit, expected, present

# the queue + daemon fixture, shared with the dispatch tests
from tests.daemon.test_dockyard_dispatch import stack as stack
from tests.support.harness import wait_state

pytestmark = pytest.mark.e2e


def admin_netpol(namespace: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace, "labels": {"team": "admins"}},
        "spec": {"podSelector": {"matchLabels": {"app": "victim"}}, "policyTypes": ["Ingress"]},
    }


def live(stack: Stack, kind: str, name: str) -> dict[str, Any]:
    res = stack.kube.kubectl("get", "-n", stack.namespace, kind, name, "--show-managed-fields", "-o", "json")
    obj: dict[str, Any] = json.loads(res.stdout)
    return obj


async def launch(stack: Stack, overrides: list[str]) -> str:
    async with stack.queue.client() as c:
        accepted = await c.launch_dockyard(
            provider="local",
            recipe=yaml.safe_load(RECIPE.read_text()),
            infra=yaml.safe_load(INFRA.read_text()),
            overrides=overrides,
        )
    return str(accepted["instanceId"])


async def test_a_name_taken_by_an_admins_object_fails_the_launch_and_touches_nothing(stack: Stack) -> None:
    """``sandbox.name: victim-app`` renders NetworkPolicy ``victim-app-netpol``, which an
    administrator already has: the launch fails naming it, nothing is applied, and the
    administrator's object keeps its spec, its resourceVersion and its only manager."""
    ns = stack.namespace
    stack.kube.kubectl("apply", "-f", "-", input=yaml.safe_dump(admin_netpol(ns, "victim-app-netpol")))
    before = live(stack, "networkpolicy", "victim-app-netpol")
    overrides = ["infra.sandbox.name=victim-app"]
    iid = await launch(stack, overrides)
    inst = await wait_state(stack.queue, iid, {"stopped"})
    assert inst["reason"] == "LaunchFailed"
    assert "NetworkPolicy/victim-app-netpol already exists" in inst["message"], inst["message"]
    assert "not this launch's" in inst["message"] and "nothing was applied" in inst["message"]

    after = live(stack, "networkpolicy", "victim-app-netpol")
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["spec"] == before["spec"] and after["metadata"]["labels"] == {"team": "admins"}
    assert {f["manager"] for f in after["metadata"]["managedFields"]} == {
        f["manager"] for f in before["metadata"]["managedFields"]
    }
    # nothing of the launch was created around it
    rendered = [m for m in expected(ns, overrides) if m["kind"] != "NetworkPolicy"]
    assert present(stack.kube, ns, rendered) == []
    records = [r for r in audit(stack) if r.get("instance") == iid]
    assert [(r["kind"], r["result"]) for r in records if r["action"] == "apply"] == [
        ("NetworkPolicy", "refused-not-owned")
    ]
    assert [r for r in records if r["action"] == "delete"] == []
    assert len([r for r in records if r["action"] == "claim"]) == 1  # permanent: not handed out again


async def test_a_second_launch_of_the_same_names_leaves_the_first_ones_objects_alone(stack: Stack) -> None:
    """Two launches of one infra: the second fails on the first one's objects and neither its
    failure nor its stop deletes them; the first one's stop still deletes its own."""
    ns = stack.namespace
    first = await launch(stack, [])
    await wait_state(stack.queue, first, {"running"})
    manifests = expected(ns, [])
    before = {o["kind"]: o["metadata"]["resourceVersion"] for o in present(stack.kube, ns, manifests)}
    assert len(before) == len(manifests)

    second = await launch(stack, [])
    inst = await wait_state(stack.queue, second, {"stopped"})
    assert inst["reason"] == "LaunchFailed" and "already exist" in inst["message"]
    async with stack.queue.client() as c:
        await c.stop(provider="local", instance_id=second)  # finished: nothing to delete
    await asyncio.sleep(1)
    after = {o["kind"]: o["metadata"]["resourceVersion"] for o in present(stack.kube, ns, manifests)}
    assert after == before

    async with stack.queue.client() as c:
        await c.stop(provider="local", instance_id=first)
    inst = await wait_state(stack.queue, first, {"stopped"})
    assert inst["reason"] == "Stopped"
    assert present(stack.kube, ns, manifests) == []


async def test_a_stop_leaves_an_object_that_is_no_longer_the_launchs(stack: Stack) -> None:
    """An administrator takes one of a running launch's objects over (replaces it under the same
    name): the launch's stop deletes the rest and names the one it left alone."""
    ns = stack.namespace
    iid = await launch(stack, [])
    await wait_state(stack.queue, iid, {"running"})
    netpol = next(m for m in expected(ns, []) if m["kind"] == "NetworkPolicy")
    name = netpol["metadata"]["name"]
    stack.kube.kubectl("delete", "-n", ns, "networkpolicy", name)
    stack.kube.kubectl("apply", "-f", "-", input=yaml.safe_dump(admin_netpol(ns, name)))
    before = live(stack, "networkpolicy", name)

    async with stack.queue.client() as c:
        await c.stop(provider="local", instance_id=iid)
    inst = await wait_state(stack.queue, iid, {"stopped"})
    assert f"not this launch's left alone: NetworkPolicy/{name}" in inst["message"], inst["message"]
    after = live(stack, "networkpolicy", name)
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    others = [m for m in expected(ns, []) if m["kind"] != "NetworkPolicy"]
    assert present(stack.kube, ns, others) == []
    deletes = {
        r["kind"]: r["result"] for r in audit(stack) if r["action"] == "delete" and r.get("instance") == iid
    }
    assert deletes["NetworkPolicy"] == "not-owned"
    assert {k: v for k, v in deletes.items() if k != "NetworkPolicy"} == {
        m["kind"]: "deleted" for m in others
    }
