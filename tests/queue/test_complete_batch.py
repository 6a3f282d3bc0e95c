"""Completions in one request (``POST /v1/dispatch/completions``), over real HTTP on both
backends: each item answered, and acting, exactly as its single ``complete`` would."""

from __future__ import annotations

from typing import Any

from nymph.protocol import TaskJSON
from tests.support.queue_helpers import Queue

COMPLETE = "/v1/dispatch/complete"
BATCH = "/v1/dispatch/completions"


async def _claim(q: Queue, *, daemon_id: str, node: str, count: int) -> list[TaskJSON]:
    """Launch ``count`` and claim them as ``daemon_id`` (every raw call as it shares one session:
    registering again would hand its leases back)."""
    user = q.user()
    for i in range(count):
        await user.launch(provider="kind", mode="small", script=f"print({i})")
    body = {"daemonId": daemon_id, "node": node, "capacity": count, "wait": 0}
    r = await q.call("POST", "/v1/dispatch/claim", token="daemon", json_body=body)
    tasks: list[TaskJSON] = r.body["tasks"]
    assert len(tasks) == count
    return tasks


def _outcome(status: int, body: dict[str, Any]) -> tuple[Any, ...]:
    """What an answer says, without its times and sentences."""
    if status == 200:
        return (200, body["status"], body.get("duplicate", False), "notBefore" in body)
    return (status, body["error"])


async def test_a_batch_answers_and_acts_as_its_single_calls_would(kind: Queue) -> None:
    """A batch mixing a good completion, a duplicate, a lost lease, a retryable failure, a task
    of another daemon's session, an unknown task and an item of the wrong shape answers each
    item as ``complete`` answers it alone, and changes exactly what those calls change; sent
    again, it is answered as the single calls sent again are and changes nothing more."""
    mine = await _claim(kind, daemon_id="d1", node="n1", count=8)
    theirs = await _claim(kind, daemon_id="d2", node="n2", count=2)
    sets: list[tuple[list[TaskJSON], TaskJSON]] = [(mine[:4], theirs[0]), (mine[4:], theirs[1])]
    for tasks, _ in sets:
        # Already completed once (the batch repeats it), and handed back (its lease is lost).
        done = {"daemonId": "d1", "taskId": tasks[0]["taskId"], "ok": True}
        assert (await kind.call("POST", COMPLETE, token="daemon", json_body=done)).status == 200
        back = {"daemonId": "d1", "taskIds": [tasks[2]["taskId"]]}
        assert (await kind.call("POST", "/v1/dispatch/release", token="daemon", json_body=back)).status == 200

    def items(tasks: list[TaskJSON], other: TaskJSON) -> list[dict[str, Any]]:
        return [
            {"taskId": tasks[0]["taskId"], "ok": True},
            {"taskId": tasks[1]["taskId"], "ok": True, "result": {"pod": "p"}},
            {"taskId": tasks[2]["taskId"], "ok": True},
            {"taskId": tasks[3]["taskId"], "ok": False, "error": "apply failed", "retryable": True},
            {"taskId": other["taskId"], "ok": True},
            {"taskId": "task-unknown", "ok": True},
            {"ok": True},
        ]

    batch_tasks, batch_other = sets[0]
    single_tasks, single_other = sets[1]
    batch_body = {"daemonId": "d1", "completions": items(batch_tasks, batch_other)}

    async def singles() -> list[tuple[Any, ...]]:
        out = []
        for item in items(single_tasks, single_other):
            r = await kind.call("POST", COMPLETE, token="daemon", json_body={"daemonId": "d1", **item})
            out.append(_outcome(r.status, r.body))
        return out

    async def batch() -> list[tuple[Any, ...]]:
        r = await kind.call("POST", BATCH, token="daemon", json_body=batch_body)
        assert r.status == 200, r.body
        answers = r.body["answers"]
        assert [a["taskId"] for a in answers] == [i.get("taskId") for i in batch_body["completions"]]
        return [_outcome(a["httpStatus"], a["body"]) for a in answers]

    expected = await singles()
    assert expected == [
        (200, "done", True, False),
        (200, "done", False, False),
        (409, "lease_lost"),
        (200, "requeued", False, True),
        (409, "lease_lost"),
        (404, "task_not_found"),
        (422, "invalid_body"),
    ]
    assert await batch() == expected
    batch_ids = [t["taskId"] for t in batch_tasks] + [batch_other["taskId"]]
    single_ids = [t["taskId"] for t in single_tasks] + [single_other["taskId"]]

    def alike(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        """The columns that say what happened (no ids, times or sequence numbers)."""
        return [
            (task["status"], task["lease_owner"], task["attempts"], task["error"], task["result"])
            + ((inst["state"], inst["reason"], inst["node"], inst["applied_daemon"]) if inst else ())
            for task, inst in rows
        ]

    assert alike(await _dict_rows(kind, batch_ids)) == alike(await _dict_rows(kind, single_ids))
    after_first = await _dict_rows(kind, batch_ids)
    # Sent again (its answer lost on the way): answered as the single calls sent again are.
    assert await batch() == await singles()
    assert await _dict_rows(kind, batch_ids) == after_first
    assert alike(await _dict_rows(kind, batch_ids)) == alike(await _dict_rows(kind, single_ids))


async def _dict_rows(q: Queue, task_ids: list[str]) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    def read(conn: Any) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
        out = []
        for tid in task_ids:
            task = dict(conn.execute("SELECT * FROM tasks WHERE task_id = ?", (tid,)).fetchone())
            inst = conn.execute(
                "SELECT * FROM instances WHERE instance_id = ?", (task["instance_id"],)
            ).fetchone()
            # ``waiting`` (why a queued launch waits) is the sweeper's, which runs meanwhile.
            out.append((task, {k: v for k, v in dict(inst).items() if k != "waiting"} if inst else None))
        return out

    return await q.store.db.read(read)


async def test_a_batch_is_checked_against_the_session(kind: Queue) -> None:
    """A batch naming another daemon than its session's is refused whole (403, nothing done); a
    batch of the wrong shape is refused whole (422); an empty one answers nothing."""
    [task] = await _claim(kind, daemon_id="d1", node="n1", count=1)
    d1 = await kind.session("d1", "n1")
    wrong = {"daemonId": "d2", "completions": [{"taskId": task["taskId"], "ok": True}]}
    r = await kind.call("POST", BATCH, token=d1, json_body=wrong)
    assert r.status == 403 and r.body["error"] == "wrong_daemon"
    assert [row[0]["status"] for row in await _dict_rows(kind, [task["taskId"]])] == ["leased"]
    for body in ({"daemonId": "d1"}, {"daemonId": "d1", "completions": [5]}):
        r = await kind.call("POST", BATCH, token=d1, json_body=body)
        assert r.status == 422 and r.body["error"] == "invalid_body", body
    r = await kind.call("POST", BATCH, token=d1, json_body={"daemonId": "d1", "completions": []})
    assert r.status == 200 and r.body == {"answers": []}
    many = [{"taskId": task["taskId"], "ok": True}] * 501
    r = await kind.call("POST", BATCH, token=d1, json_body={"daemonId": "d1", "completions": many})
    assert r.status == 422
    r = await kind.call("POST", BATCH, token=d1, json_body={"daemonId": "d1", "completions": many[:500]})
    statuses = [(a["httpStatus"], a["body"].get("duplicate", False)) for a in r.body["answers"]]
    assert statuses == [(200, False)] + [(200, True)] * 499
