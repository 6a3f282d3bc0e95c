"""The daemon's completions in batches: what the outbox holds when the sender runs goes to a real
queue (over HTTP, on both backends) in one request, each completion settled by its own answer;
a queue without the batch route gets one ``complete`` each; a daemon killed between saving its
completions and hearing the queue's answer sends them again, and the queue answers the same."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from nymph.client import DaemonIdentity, QueueClient
from nymph.daemon.diskhealth import DiskHealth
from nymph.daemon.leases import LeaseLedger
from nymph.daemon.metrics import Metrics
from nymph.daemon.outbox import Outbox
from nymph.daemon.outboxitems import next_batch, sends
from nymph.daemon.sender import QueueSender
from nymph.protocol import TaskJSON
from tests.support.queue_helpers import Queue, start_app

BATCH = "/v1/dispatch/completions"
SINGLE = "/v1/dispatch/complete"
CHUNKS = "/v1/dispatch/logchunks/batch"
CHUNK = "/v1/dispatch/logchunks"


class CountingClient(QueueClient):
    """A daemon's queue client that counts its requests by path."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.paths: collections.Counter[str] = collections.Counter()
        self.order: list[str] = []

    async def request(self, method: str, path: str, **kwargs: Any) -> Any:
        self.paths[path] += 1
        self.order.append(path)
        return await super().request(method, path, **kwargs)


@pytest.fixture
async def old_queue(kind: Queue) -> AsyncIterator[str]:
    """The queue as one older than the batch route: that route answers 404, as an unknown route."""
    session = aiohttp.ClientSession()

    async def forward(request: web.Request) -> web.StreamResponse:
        if request.path in (BATCH, CHUNKS):
            return web.json_response({"error": "not_found", "detail": "no such route"}, status=404)
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")}
        async with session.request(
            request.method, kind.url + request.path_qs, data=await request.read(), headers=headers
        ) as r:
            return web.Response(status=r.status, body=await r.read(), content_type=r.content_type)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    runner, url = await start_app(app)
    try:
        yield url
    finally:
        await runner.cleanup()
        await session.close()


class Daemon:
    """The parts of a daemon that complete tasks: a client, the lease ledger, the outbox and the
    sender (one per "process": a new one over the same state directory is a restart)."""

    def __init__(self, q: Queue, state: Path, *, url: str | None = None, daemon_id: str = "d1") -> None:
        self.id = daemon_id
        self.client = CountingClient(
            base_url=url or q.url,
            token=q.daemon_token,
            timeout=20,
            daemon=DaemonIdentity(daemon_id=daemon_id, node=f"node-{daemon_id}"),
        )
        self.outbox = Outbox(state)
        self.leases = LeaseLedger(outbox=self.outbox, disk=DiskHealth())
        self.sender = QueueSender(
            daemon_id=daemon_id, client=self.client, leases=self.leases, outbox=self.outbox, metrics=Metrics()
        )

    async def claim(self, q: Queue, count: int) -> list[TaskJSON]:
        user = q.user()
        for i in range(count):
            await user.launch(provider="kind", mode="small", script=f"print({i})")
        tasks = await self.client.claim(daemon_id=self.id, node=f"node-{self.id}", capacity=count, wait=0)
        assert len(tasks) == count
        for t in tasks:
            self.leases.hold(t["taskId"], t)
        return tasks

    async def flush(self) -> None:
        runner = asyncio.create_task(self.outbox.run(self.sender))
        try:
            assert await self.outbox.flush(timeout=20)
        finally:
            runner.cancel()
            await self.client.close()


async def _statuses(q: Queue, tasks: list[TaskJSON]) -> list[str]:
    def read(conn: Any) -> list[str]:
        rows = [
            conn.execute("SELECT status FROM tasks WHERE task_id = ?", (t["taskId"],)).fetchone()
            for t in tasks
        ]
        return [str(r["status"]) for r in rows]

    return await q.store.db.read(read)


async def test_launches_reported_then_completed_go_in_two_requests_reports_first(
    kind: Queue, tmp_path: Path
) -> None:
    """Launches whose "starting" report, log chunk and completion wait in the outbox together
    (as each applied launch leaves them) reach the queue as one report request, then one
    completion request, then one for their log chunks: each instance's report before its
    completion, all of them taken."""
    d = Daemon(kind, tmp_path / "state")
    tasks = await d.claim(kind, 5)
    d.client.order.clear()
    for t in tasks:
        iid = t["instanceId"]
        d.outbox.report(instance_id=iid, state="starting")
        d.outbox.log_chunk(instance_id=iid, offset=0, data=b"", final=True)
        d.outbox.complete(task_id=t["taskId"], ok=True, instance=iid)
    await d.flush()
    assert d.client.order == ["/v1/dispatch/report", BATCH, CHUNKS]
    assert await _statuses(kind, tasks) == ["done"] * 5
    for t in tasks:
        inst = await kind.user().get_instance(provider="kind", instance_id=t["instanceId"])
        assert inst["state"] == "starting"
    assert d.outbox.pending == 0


async def test_completions_queued_together_go_in_one_request(kind: Queue, tmp_path: Path) -> None:
    """Completions waiting in the outbox together reach the queue in one request, each settled by
    its own answer: the taken ones done, the one whose lease was lost dropped (not retried)."""
    d = Daemon(kind, tmp_path / "state")
    tasks = await d.claim(kind, 5)
    await d.client.release(daemon_id="d1", task_ids=[tasks[2]["taskId"]])  # its lease is lost
    for t in tasks[:4]:
        d.leases.complete(task_id=t["taskId"], ok=True)
    d.leases.complete(task_id=tasks[4]["taskId"], ok=False, error="bad image", retryable=False)
    await d.flush()
    assert d.client.paths[BATCH] == 1 and d.client.paths[SINGLE] == 0
    assert await _statuses(kind, tasks) == ["done", "done", "pending", "done", "failed"]
    assert d.leases.held == {} and d.leases.completing == set()
    assert d.outbox.pending == 0


async def test_a_queue_without_the_batch_route_gets_single_calls(
    kind: Queue, old_queue: str, tmp_path: Path
) -> None:
    """An older queue answers the batch route 404: the completions go one ``complete`` each,
    answered and settled as before, and later ones do not try the batch route again."""
    d = Daemon(kind, tmp_path / "state", url=old_queue)
    tasks = await d.claim(kind, 4)
    for t in tasks[:3]:
        d.leases.complete(task_id=t["taskId"], ok=True)
    runner = asyncio.create_task(d.outbox.run(d.sender))
    try:
        assert await d.outbox.flush(timeout=20)
        assert d.client.paths[BATCH] == 1 and d.client.paths[SINGLE] == 3
        d.leases.complete(task_id=tasks[3]["taskId"], ok=True)
        assert await d.outbox.flush(timeout=20)
    finally:
        runner.cancel()
        await d.client.close()
    assert d.client.paths[BATCH] == 1 and d.client.paths[SINGLE] == 4
    assert await _statuses(kind, tasks) == ["done"] * 4
    assert d.leases.held == {}


async def _logs(q: Queue, tasks: list[TaskJSON]) -> list[str]:
    user = q.user()
    return [str(await user.get_logs(provider="kind", instance_id=t["instanceId"])) for t in tasks]


async def test_log_chunks_queued_together_go_in_one_request_and_a_refused_one_is_dropped(
    kind: Queue, tmp_path: Path
) -> None:
    """Log chunks waiting in the outbox together reach the queue in one request, in order (two
    of one instance end to end), each settled by its own answer: one for an instance the queue
    does not know is dropped, not retried, and costs the others nothing."""
    d = Daemon(kind, tmp_path / "state")
    tasks = await d.claim(kind, 3)
    d.client.order.clear()
    for t in tasks:
        d.outbox.log_chunk(instance_id=t["instanceId"], offset=0, data=f"{t['instanceId']}\n".encode())
    d.outbox.log_chunk(instance_id="lakeshore-00000000", offset=0, data=b"nobody's")
    first = tasks[0]["instanceId"]
    d.outbox.log_chunk(instance_id=first, offset=len(first) + 1, data=b"more\n")
    await d.flush()
    assert d.client.order == [CHUNKS]
    assert await _logs(kind, tasks) == [
        f"{tasks[0]['instanceId']}\nmore\n",
        *[f"{t['instanceId']}\n" for t in tasks[1:]],
    ]
    assert d.outbox.pending == 0


async def test_a_request_of_a_batch_refused_for_good_costs_the_others_nothing(
    kind: Queue, tmp_path: Path
) -> None:
    """A batch going out in two requests: the first (a report on another daemon's instance,
    403 not_instance_daemon) is dropped, and the second (this daemon's completion) still goes
    and is taken."""
    other = Daemon(kind, tmp_path / "other", daemon_id="d2")
    [theirs] = await other.claim(kind, 1)
    d = Daemon(kind, tmp_path / "state")
    [mine] = await d.claim(kind, 1)
    d.client.order.clear()
    d.outbox.report(instance_id=theirs["instanceId"], state="running")
    d.outbox.complete(task_id=mine["taskId"], ok=True, instance=theirs["instanceId"])
    await d.flush()
    await other.client.close()
    assert d.client.order == ["/v1/dispatch/report", BATCH]
    assert await _statuses(kind, [mine]) == ["done"]
    assert d.outbox.pending == 0


async def test_log_chunks_go_one_each_to_a_queue_without_the_batch_route(
    kind: Queue, old_queue: str, tmp_path: Path
) -> None:
    """An older queue answers the chunk batch route 404: the chunks go one request each, and
    later ones do not try the batch route again."""
    d = Daemon(kind, tmp_path / "state", url=old_queue)
    tasks = await d.claim(kind, 3)
    for t in tasks[:2]:
        d.outbox.log_chunk(instance_id=t["instanceId"], offset=0, data=b"one\n")
    runner = asyncio.create_task(d.outbox.run(d.sender))
    try:
        assert await d.outbox.flush(timeout=20)
        assert d.client.paths[CHUNKS] == 1 and d.client.paths[CHUNK] == 2
        d.outbox.log_chunk(instance_id=tasks[2]["instanceId"], offset=0, data=b"one\n")
        d.outbox.log_chunk(instance_id=tasks[2]["instanceId"], offset=4, data=b"two\n")
        assert await d.outbox.flush(timeout=20)
    finally:
        runner.cancel()
        await d.client.close()
    assert d.client.paths[CHUNKS] == 1 and d.client.paths[CHUNK] == 4
    assert await _logs(kind, tasks) == ["one\n", "one\n", "one\ntwo\n"]


async def test_completions_saved_before_a_kill_are_sent_after_the_restart(
    kind: Queue, tmp_path: Path
) -> None:
    """Completions made durable, then the daemon killed before sending them: the restarted
    daemon sends them, in one request. (Its new session made the queue hand the old one's leases
    back, so the queue answers each 409 lease_lost, as it would a single call, and the tasks are
    given out again: nothing is lost or done twice.)"""
    first = Daemon(kind, tmp_path / "state")
    tasks = await first.claim(kind, 3)
    for t in tasks:
        first.leases.complete(task_id=t["taskId"], ok=True)
    await first.client.close()  # killed: nothing was sent
    again = Daemon(kind, tmp_path / "state")
    assert [i["taskId"] for i in again.outbox.mem] == [t["taskId"] for t in tasks]
    await again.flush()
    assert again.client.paths[BATCH] == 1 and again.client.paths[SINGLE] == 0
    assert await _statuses(kind, tasks) == ["pending"] * 3
    assert again.outbox.pending == 0


async def test_a_batch_sent_again_after_a_kill_is_answered_the_same(kind: Queue, tmp_path: Path) -> None:
    """The daemon killed after the queue committed a batch but before it saved that it was sent:
    the restarted daemon sends the batch again in one request, the queue answers each as already
    done (duplicate), nothing is dropped as refused and nothing changes at the queue."""
    first = Daemon(kind, tmp_path / "state")
    tasks = await first.claim(kind, 3)
    first.leases.complete(task_id=tasks[0]["taskId"], ok=True)
    first.leases.complete(task_id=tasks[1]["taskId"], ok=False, error="exit 1", retryable=False)
    first.leases.complete(task_id=tasks[2]["taskId"], ok=True, result={"pod": "p"})
    kind_, batch = first.outbox._next_batch()
    await first.sender(kind_, batch)  # the queue has them; the ack is never written
    await first.client.close()
    committed = await _statuses(kind, tasks)
    assert committed == ["done", "failed", "done"]
    again = Daemon(kind, tmp_path / "state")
    assert len(again.outbox.mem) == 3
    answers = await again.client.complete_many(
        daemon_id="d1",
        completions=[
            {"task_id": i["taskId"], "ok": i["ok"], "error": i.get("error")} for i in again.outbox.mem
        ],
    )
    assert [(a.get("status"), a.get("duplicate")) for a in answers if isinstance(a, dict)] == [
        ("done", True),
        ("failed", True),
        ("done", True),
    ]
    await again.flush()
    assert again.client.paths[BATCH] == 2 and again.client.paths[SINGLE] == 0
    assert await _statuses(kind, tasks) == committed
    assert again.outbox.pending == 0


def test_a_batch_keeps_each_instances_order() -> None:
    """A send takes the run of reports and completions at the head of the outbox and sends it
    in at most MAX_PHASES requests, reports and completions in turn, so that each instance's
    reports and completions keep their order and a stream's reports theirs (the queue ignores
    a seq below one it applied); the item that would need one more request ends the run, and
    one of unknown instance joins only before any report. Log chunks are passed over (left, in
    their order, for sends of their own); anything else (a log tail) ends the run."""

    def report(instance: str) -> dict[str, Any]:
        return {"kind": "report", "stream": "s", "instanceId": instance, "_bytes": 10}

    def complete(task: str, instance: str | None) -> dict[str, Any]:
        item: dict[str, Any] = {"kind": "complete", "taskId": task, "_bytes": 10}
        if instance is not None:
            item["instanceId"] = instance
        return item

    def name(item: dict[str, Any]) -> str:
        return str(item.get("taskId") or item["instanceId"])

    def batch(*items: dict[str, Any]) -> list[tuple[str, list[str]]]:
        """The requests the next send makes."""
        _, taken = next_batch(list(items), max_items=200, max_bytes=10_000)
        return [(kind, [name(i) for i in part]) for kind, part in sends(taken)]

    assert batch(complete("t1", None), report("a"), complete("t2", "b"), report("b")) == [
        ("complete", ["t1", "t2"]),
        ("report", ["a", "b"]),
    ]
    # each launch: "starting", its task's completion, then "running": three requests for all
    launches = [x for i in range(5) for x in (report(f"i{i}"), complete(f"t{i}", f"i{i}"))]
    launches += [report(f"i{i}") for i in range(5)]
    assert batch(*launches) == [
        ("report", [f"i{i}" for i in range(5)]),
        ("complete", [f"t{i}" for i in range(5)]),
        ("report", [f"i{i}" for i in range(5)]),
    ]
    # a report stays after the reports before it (its stream's order), whatever its instance
    assert batch(report("a"), complete("t1", "a"), report("a"), report("b")) == [
        ("report", ["a"]),
        ("complete", ["t1"]),
        ("report", ["a", "b"]),
    ]
    # a fifth turn is one too many: the run ends before it
    turns = [report("a"), complete("t1", "a"), report("a"), complete("t2", "a"), report("a")]
    assert batch(*turns) == [("report", ["a"]), ("complete", ["t1"]), ("report", ["a"]), ("complete", ["t2"])]
    assert batch(report("a"), complete("t1", None)) == [("report", ["a"])]
    chunk = {"kind": "logchunk", "instanceId": "a", "_bytes": 10}
    assert batch(complete("t1", "a"), chunk, complete("t2", "b"), report("b")) == [
        ("complete", ["t1", "t2"]),
        ("report", ["b"]),
    ]
    assert batch(complete("t1", "a"), {"kind": "logs", "instanceId": "a"}, complete("t2", "b")) == [
        ("complete", ["t1"])
    ]
    assert next_batch([chunk, complete("t1", "a")], max_items=200, max_bytes=10_000) == ("logchunk", [chunk])
    two = {**chunk, "instanceId": "b"}
    run = [chunk, two, complete("t1", "a"), dict(chunk)]
    assert next_batch(run, max_items=200, max_bytes=10_000) == (
        "logchunk",
        [chunk, two],
    )  # the chunks at the head
    assert next_batch(run, max_items=1, max_bytes=10_000) == ("logchunk", [chunk])
    assert next_batch(run, max_items=200, max_bytes=15) == ("logchunk", [chunk])
    chunks = [complete("t0", "z"), *[dict(chunk) for _ in range(50)], complete("t1", "a")]
    # looking at SCAN_FACTOR * max_items items at most
    assert [i["taskId"] for i in next_batch(chunks, max_items=10, max_bytes=10_000)[1]] == ["t0"]
    assert [i["taskId"] for i in next_batch(chunks, max_items=13, max_bytes=10_000)[1]] == ["t0", "t1"]
    many = [complete(f"t{i}", f"i{i}") for i in range(300)]
    assert len(next_batch(many, max_items=200, max_bytes=10_000)[1]) == 200
