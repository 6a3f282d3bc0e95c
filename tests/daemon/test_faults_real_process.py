"""The real daemon process against hostile tasks and an unwritable root.

Hostile tasks come through a man in the middle: the daemon talks to the queue over plain HTTP,
through a proxy in the test that rewrites the tasks of a claim answer, as anyone on that path
could. The unwritable root is the root directory moved aside and a plain file left in its place:
every write under it (audit log, outbox, workdirs) then fails as on a full or read-only disk,
with no mount and no fault switch in the product, and moving it back is the space returning.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from nymph.daemon.audit import verify
from nymph.localcluster import LocalCluster
from tests.support.harness import (
    DaemonProc,
    QueueProc,
    daemon_kubeconfig,
    launch,
    pods,
    setup_provider,
    wait_state,
)

pytestmark = pytest.mark.e2e

Tamper = Callable[[dict[str, Any]], None]


@contextlib.asynccontextmanager
async def mitm(upstream: str, tamper: Tamper) -> AsyncIterator[str]:
    """A plain-HTTP proxy to ``upstream`` that passes every task of a claim answer to ``tamper``."""
    session = aiohttp.ClientSession()

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")}
        async with session.request(
            request.method, upstream + request.path_qs, data=body, headers=headers
        ) as resp:
            data = await resp.read()
            if request.path == "/v1/dispatch/claim" and resp.status == 200:
                answer = json.loads(data)
                for task in answer.get("tasks", []):
                    tamper(task)
                data = json.dumps(answer).encode()
            return web.Response(body=data, status=resp.status, content_type="application/json")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
        await session.close()


def stop_task(db: Path, iid: str) -> tuple[str, str | None]:
    with sqlite3.connect(db) as conn:
        row = conn.execute(
            "SELECT status, error FROM tasks WHERE kind = 'stop' AND instance_id = ?", (iid,)
        ).fetchone()
    return (row[0], row[1]) if row else ("none", None)


def pod_names(kube: LocalCluster, namespace: str) -> set[str]:
    return {p["metadata"]["name"] for p in kube.api("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]}


def bare_pod(name: str, namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }


async def test_hostile_stop_tasks_leave_every_pod_alone(
    kube: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    q = QueueProc(tmp_path / "queue.db")
    q.tokens()
    q.start()
    other = f"{namespace}-b"
    kube.api(
        "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": other}}
    )
    tampered: dict[str, Tamper] = {}

    def tamper(task: dict[str, Any]) -> None:
        if task.get("kind") == "stop" and task.get("instanceId") in tampered:
            tampered[task["instanceId"]](task)

    d: DaemonProc | None = None
    try:
        await setup_provider(q, namespace)
        async with mitm(q.url, tamper) as url:
            via_proxy = replace(q, port=int(url.rsplit(":", 1)[1]), proc=None)
            kc = daemon_kubeconfig(kube, namespace, tmp_path)
            d = DaemonProc(via_proxy, kc, namespace, tmp_path / "root", extra=("--reap-after", "3600"))
            d.start()
            a, b, keep = [await launch(q, tags={"sim.nymph.io/run": "1h"}) for _ in range(3)]
            for iid in (a, b, keep):
                await wait_state(q, iid, {"running"})
            # Pods nymph did not make: one in the served namespace, one of b's name elsewhere.
            kube.api("POST", f"/api/v1/namespaces/{namespace}/pods", bare_pod("bystander", namespace, {}))
            kube.api("POST", f"/api/v1/namespaces/{other}/pods", bare_pod(b, other, {"lakeshore": "true"}))

            def to_all(task: dict[str, Any]) -> None:
                task["instanceId"] = "--all"

            def to_other(task: dict[str, Any]) -> None:
                task["kubeNamespace"] = other

            tampered.update({a: to_all, b: to_other})
            async with q.client() as c:
                await c.stop(provider="local", instance_id=a)
                await c.stop(provider="local", instance_id=b)
            deadline = time.monotonic() + 60
            while {stop_task(q.db, a)[0], stop_task(q.db, b)[0]} - {"failed"}:
                assert time.monotonic() < deadline, (stop_task(q.db, a), stop_task(q.db, b))
                await asyncio.sleep(0.2)
            assert "instanceId" in (stop_task(q.db, a)[1] or "")
            assert "does not serve namespace" in (stop_task(q.db, b)[1] or "")
            await asyncio.sleep(1)  # a delete would have been issued by now
            assert {a, b, keep, "bystander"} <= pod_names(kube, namespace)
            assert b in pod_names(kube, other)
            # The daemon is still working: an untampered stop goes through.
            async with q.client() as c:
                await c.stop(provider="local", instance_id=keep)
            assert (await wait_state(q, keep, {"stopped"}))["reason"] == "Stopped"
            assert {a, b, "bystander"} <= pod_names(kube, namespace)
    finally:
        if d is not None:
            d.kill()
        q.kill()
        kube.api("DELETE", f"/api/v1/namespaces/{other}")


def readyz(port: int) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def launch_task(db: Path, iid: str) -> tuple[str, int]:
    with sqlite3.connect(db) as conn:
        row = conn.execute(
            "SELECT status, attempts FROM tasks WHERE kind = 'launch' AND instance_id = ?", (iid,)
        ).fetchone()
    return (str(row[0]), int(row[1])) if row else ("none", 0)


async def test_a_daemon_is_ready_before_its_first_long_poll_times_out(
    kube: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    """An idle queue answers a held claim only when it times out; the daemon's first claim is
    not held, so it is ready (its Pod Ready, a rolling update moving on) as soon as the queue
    answered, not a whole hold later. It holds the ones after that."""
    q = QueueProc(tmp_path / "queue.db")
    q.tokens()
    q.start()
    hold = 60  # the queue's longest
    d = DaemonProc(
        q,
        daemon_kubeconfig(kube, namespace, tmp_path),
        namespace,
        tmp_path / "root",
        extra=("--poll-wait", str(hold)),
    )
    try:
        await setup_provider(q, namespace)
        started = time.monotonic()
        d.start()
        while readyz(d.port)[0] != 200:
            assert time.monotonic() - started < hold / 2, readyz(d.port)
            await asyncio.sleep(0.2)
        assert readyz(d.port)[1]["queue"] is True
        # the claims after it are held (one answered so far), and work answers one mid-hold
        await asyncio.sleep(3)
        assert 'nymph_claims_total{result="ok"} 1.0' in d.metrics()
        iid = await launch(q, tags={"sim.nymph.io/run": "1s"})
        inst = await wait_state(q, iid, {"stopped"}, timeout=60)
        assert inst["reason"] == "Completed", inst
        assert time.monotonic() - started < hold, "the launch waited for a hold to end"
    finally:
        d.kill()
        q.kill()


async def test_an_unwritable_root_pauses_the_daemon_and_it_resumes_without_a_restart(
    kube: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    q = QueueProc(tmp_path / "queue.db")
    q.tokens()
    q.start()
    root = tmp_path / "root"
    d = DaemonProc(
        q, daemon_kubeconfig(kube, namespace, tmp_path), namespace, root, extra=("--reap-after", "3600")
    )
    try:
        await setup_provider(q, namespace)
        d.start()
        deadline = time.monotonic() + 30
        while readyz(d.port)[0] != 200:
            assert time.monotonic() < deadline, readyz(d.port)
            await asyncio.sleep(0.2)
        aside = tmp_path / "root.aside"
        root.rename(aside)
        root.write_text("not a directory\n")  # every write under the root fails from now on
        iid = await launch(q, tags={"sim.nymph.io/run": "1s"})
        deadline = time.monotonic() + 30
        while readyz(d.port)[0] != 503:
            assert time.monotonic() < deadline, readyz(d.port)
            await asyncio.sleep(0.2)
        _, body = readyz(d.port)
        assert body["disk"] is False and "audit log" in body["diskProblem"]
        # The claim was handed back (the release refunds its attempt), not held and renewed
        # for ever; nothing was applied.
        assert 'nymph_tasks_claimed_total{kind="launch"} 1.0' in d.metrics()
        deadline = time.monotonic() + 20
        while launch_task(q.db, iid) != ("pending", 0):
            assert time.monotonic() < deadline, launch_task(q.db, iid)
            await asyncio.sleep(0.2)
        await asyncio.sleep(2)
        assert launch_task(q.db, iid) == ("pending", 0), "claiming is paused while the root is unwritable"
        assert 'nymph_tasks_claimed_total{kind="launch"} 1.0' in d.metrics()
        assert not pods(kube, namespace)
        # Space returns: the daemon resumes by itself.
        root.unlink()
        aside.rename(root)
        inst = await wait_state(q, iid, {"stopped"}, timeout=90)
        assert inst["reason"] == "Completed", inst
        assert readyz(d.port)[0] == 200
        assert d.proc is not None and d.proc.poll() is None, "no restart"
        result = verify(root / "audit.jsonl")
        assert result.ok, result
    finally:
        d.kill()
        q.kill()


async def test_a_launch_never_adopts_a_foreign_pod_of_its_name(
    kube: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    q = QueueProc(tmp_path / "queue.db")
    q.tokens()
    q.start()
    # Two Pods nymph did not make for these launches: one even carries nymph's label.
    foreign = {"lakeshore-f0f0f0f0": {"lakeshore": "true"}, "lakeshore-e0e0e0e0": {}}
    for name, labels in foreign.items():
        kube.api("POST", f"/api/v1/namespaces/{namespace}/pods", bare_pod(name, namespace, labels))
    renamed: dict[str, str] = {}

    def tamper(task: dict[str, Any]) -> None:
        # Rename a launch to a foreign Pod's name, as an id collision would.
        new = renamed.get(str(task.get("instanceId")))
        if task.get("kind") == "launch" and new is not None:
            task["instanceId"] = new
            task["spec"]["instanceId"] = new

    d: DaemonProc | None = None
    try:
        await setup_provider(q, namespace)
        async with mitm(q.url, tamper) as url:
            via_proxy = replace(q, port=int(url.rsplit(":", 1)[1]), proc=None)
            kc = daemon_kubeconfig(kube, namespace, tmp_path)
            d = DaemonProc(via_proxy, kc, namespace, tmp_path / "root", extra=("--reap-after", "3600"))
            async with q.client() as c:
                ids = []
                for name in foreign:
                    accepted = await c.launch(provider="local", mode="py", script="print(1)\n", tags={})
                    renamed[str(accepted["instanceId"])] = name
                    ids.append(str(accepted["instanceId"]))
            d.start()
            deadline = time.monotonic() + 60
            while True:
                with sqlite3.connect(q.db) as conn:
                    rows = dict(
                        conn.execute(
                            "SELECT instance_id, status || ':' || attempts || ':' || COALESCE(error, '') "
                            "FROM tasks WHERE kind = 'launch'"
                        ).fetchall()
                    )
                if all(rows.get(i, "").startswith("failed") for i in ids):
                    break
                assert time.monotonic() < deadline, rows
                await asyncio.sleep(0.2)
            labelled, bare = ids
            assert "Conflict" in rows[labelled] and "not created for this launch" in rows[labelled]
            # the Pod the watch does not see (no nymph label): the API server's refusal of the
            # apply tells it is someone else's, and it is not tried again
            assert rows[bare].startswith("failed:1:Conflict: a Pod named lakeshore-e0e0e0e0"), rows[bare]
            assert "another field manager owns its fields" in rows[bare]
            for name, labels in foreign.items():
                pod = kube.api("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
                assert (pod["metadata"].get("labels") or {}) == labels, "the foreign Pod was not changed"
                assert "nymph.io/launch" not in (pod["metadata"].get("annotations") or {})
    finally:
        if d is not None:
            d.kill()
        q.kill()
