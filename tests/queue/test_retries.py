"""Retry policies over real HTTP (daemon path, SQLite and PostgreSQL): which endings are retried
and which are not (with the reason in the history), the links between attempts, the memory
and node adjustments, backoff, the limit, groups, and exactly one retry per attempt however
often the failure is reported or completed."""

from __future__ import annotations

from typing import Any

from tests.support.queue_helpers import Queue

NS = "/v1/namespaces/default"
LAUNCH = NS + "/providers/kind/launch"
INSTANCES = NS + "/providers/kind/instances"
MEMORY = {"requests": {"memory": "256Mi"}, "limits": {"memory": "512Mi"}}


class Daemon:
    """A fake daemon on node n1: claims, completes and reports over the dispatch routes."""

    def __init__(self, q: Queue) -> None:
        self.q = q
        self.client = q.daemon()
        self.seq = 0

    async def take(self) -> list[dict[str, Any]]:
        tasks = await self.client.claim(daemon_id="d1", node="n1", capacity=10, wait=0)
        for t in tasks:
            await self.client.complete(daemon_id="d1", task_id=t["taskId"], ok=True)
        return list(tasks)

    async def end(self, iid: str, reason: str, exit_code: int | None = None) -> None:
        self.seq += 1
        report: dict[str, Any] = {
            "seq": self.seq,
            "instanceId": iid,
            "state": "stopped",
            "reason": reason,
            "message": "",
        }
        if exit_code is not None:
            report.update(exitCode=exit_code, terminationReason=reason)
        await self.client.report(daemon_id="d1", stream="s", reports=[report])


async def _launch(q: Queue, retry: dict[str, Any], **fields: Any) -> str:
    body = {"mode": "small", "script": "print(1)", "fields": {"retry": retry, **fields}}
    r = await q.call("POST", LAUNCH, json_body=body)
    assert r.status == 202, r.body
    return str(r.body["instanceId"])


async def _get(q: Queue, iid: str) -> dict[str, Any]:
    r = await q.call("GET", f"{INSTANCES}/{iid}")
    assert r.status == 200, r.body
    return dict(r.body)


async def _count(q: Queue) -> int:
    return len((await q.call("GET", INSTANCES)).body["items"])


BAD_RULES = [
    ({"limit": 2, "on": ["Evicted", "Oops"]}, "launch.fields.retry.on[1]"),
    ({"limit": 2, "on": ["exit:9-3"]}, "launch.fields.retry.on[0]"),
    ({"limit": 2, "on": ["Completed"]}, "launch.fields.retry.on[0]"),
    ({"on": ["Error"]}, "launch.fields.retry.limit"),
    ({"limit": 1, "backoff": "soon"}, "launch.fields.retry.backoff"),
    ({"limit": 1, "memoryFactor": 0.5}, "launch.fields.retry.memoryFactor"),
    ({"limit": 1, "colour": 1}, "launch.fields.retry.colour"),
]


async def test_a_bad_retry_rule_is_a_400_naming_it(kind: Queue) -> None:
    """Nothing is queued for a launch whose retry policy is wrong; the error names the rule."""
    for retry, needle in BAD_RULES:
        r = await kind.call(
            "POST", LAUNCH, json_body={"mode": "small", "script": "x", "fields": {"retry": retry}}
        )
        assert r.status == 400 and needle in r.body["detail"], (retry, r.body)
    assert await _count(kind) == 0


async def test_a_bad_retry_on_a_mode_is_refused_when_the_mode_is_made(kind: Queue) -> None:
    """A mode's retry policy is checked when the mode is saved, naming mode.retry."""
    mode = {
        "name": "bad",
        "provider": "kind",
        "fields": {"image": "busybox", "retry": {"limit": 1, "on": ["x"]}},
    }
    r = await kind.call("POST", NS + "/modes", json_body=mode)
    assert r.status == 400 and "mode.retry.on[0]" in r.body["detail"], r.body


async def test_an_oom_kill_is_retried_once_with_more_memory_however_often_it_is_reported(kind: Queue) -> None:
    """The retry is a new instance linked both ways, its memory doubled, its history naming the
    rule; the same failure reported again, or its completion sent again, makes no second one."""
    retry = {"limit": 2, "on": ["OOMKilled"], "backoff": "0s", "memoryFactor": 2}
    first = await _launch(kind, retry, resources=MEMORY)
    d = Daemon(kind)
    [task] = await d.take()
    await d.end(first, "OOMKilled", 137)
    await d.end(first, "OOMKilled", 137)  # redelivered with a new seq: the instance is stopped already
    done = await d.client.complete(daemon_id="d1", task_id=task["taskId"], ok=True)
    assert done.get("duplicate") is True
    old = await _get(kind, first)
    assert old["state"] == "stopped" and old["reason"] == "OOMKilled" and old["attempt"] == 1
    second = old["retriedAs"]
    assert (
        "rule OOMKilled matched" in old["history"][-1]["message"] and second in old["history"][-1]["message"]
    )
    new = await _get(kind, second)
    assert new["retryOf"] == first and new["attempt"] == 2 and new["state"] == "queued"
    assert await _count(kind) == 2
    [retried] = await d.take()
    assert retried["instanceId"] == second
    assert retried["spec"]["resources"] == {
        "requests": {"memory": str(512 * 2**20)},
        "limits": {"memory": str(2**30)},
    }


async def test_exit_code_rules_match_the_code_and_say_why_when_they_do_not(kind: Queue) -> None:
    """exit:1-5 retries exit code 3; exit code 7 is not retried and the history says why."""
    retry = {"limit": 3, "on": ["exit:1-5"], "backoff": "0s"}
    d = Daemon(kind)
    first = await _launch(kind, retry)
    await d.take()
    await d.end(first, "Error", 3)
    second = (await _get(kind, first))["retriedAs"]
    await d.take()
    await d.end(second, "Error", 7)
    last = await _get(kind, second)
    assert "retriedAs" not in last and last["attempt"] == 2
    assert "not retried: no retry rule names Error or exit code 7" in last["history"][-1]["message"]


async def test_configuration_errors_are_retried_only_when_named(kind: Queue) -> None:
    """Without ``on`` every failure is retried but ImagePull, CreateContainerError and LaunchFailed."""
    d = Daemon(kind)
    pulled = await _launch(kind, {"limit": 3, "backoff": "0s"})
    refused = await _launch(kind, {"limit": 3, "backoff": "0s"})
    tasks = await d.client.claim(daemon_id="d1", node="n1", capacity=10, wait=0)
    by_id = {t["instanceId"]: t for t in tasks}
    await d.client.complete(daemon_id="d1", task_id=by_id[pulled]["taskId"], ok=True)
    await d.client.complete(daemon_id="d1", task_id=by_id[refused]["taskId"], ok=False, error="forbidden")
    await d.end(pulled, "ImagePull")
    for iid, reason in ((pulled, "ImagePull"), (refused, "LaunchFailed")):
        inst = await _get(kind, iid)
        assert inst["reason"] == reason and "retriedAs" not in inst
        assert "retried only when named" in inst["history"][-1]["message"]
    named = await _launch(kind, {"limit": 1, "on": ["ImagePull"], "backoff": "0s"})
    await d.take()
    await d.end(named, "ImagePull")
    assert "retriedAs" in await _get(kind, named)


async def test_the_limit_ends_the_chain_and_backoff_holds_the_next_attempt(kind: Queue) -> None:
    """The last retry allowed says so; a backoff (capped by maxBackoff, 5m by default) keeps
    the next attempt from being handed out; avoidNode after Evicted names the node."""
    d = Daemon(kind)
    first = await _launch(kind, {"limit": 1, "on": ["Error"], "backoff": "0s"})
    await d.take()
    await d.end(first, "Error", 1)
    second = (await _get(kind, first))["retriedAs"]
    await d.take()
    await d.end(second, "Error", 1)
    last = await _get(kind, second)
    assert "retriedAs" not in last and "limit of 1 retries is reached" in last["history"][-1]["message"]

    slow = await _launch(kind, {"limit": 1, "on": ["Evicted"], "backoff": "1h", "avoidNode": True})
    await d.take()
    await d.end(slow, "Evicted")
    held = await _get(kind, (await _get(kind, slow))["retriedAs"])
    assert held["state"] == "queued" and "after 300s" in held["history"][0]["message"]
    assert "not on node n1" in held["history"][0]["message"]
    assert await d.client.claim(daemon_id="d1", node="n1", capacity=10, wait=0) == []


async def test_a_group_member_is_retried_in_its_place_and_a_stopped_group_is_not(kind: Queue) -> None:
    """The retry keeps the member's group and index; the group counts each launch's latest
    attempt; once the group's stop was asked, no member is retried."""
    body = {
        "mode": "small",
        "script": "x",
        "count": 2,
        "fields": {"retry": {"limit": 2, "on": ["Error"], "backoff": "0s"}},
    }
    r = await kind.call("POST", NS + "/providers/kind/launches", json_body=body)
    gid, ids = r.body["groupId"], [i["instanceId"] for i in r.body["instances"]]
    d = Daemon(kind)
    await d.take()
    await d.end(ids[1], "Error", 1)
    retried = await _get(kind, (await _get(kind, ids[1]))["retriedAs"])
    assert retried["groupId"] == gid and retried["groupIndex"] == 1
    group = (await kind.call("GET", NS + f"/groups/{gid}")).body
    assert group["total"] == 2 and group["counts"] == {"queued": 2}
    assert (await kind.call("DELETE", NS + f"/groups/{gid}")).status == 204
    await d.end(ids[0], "Error", 1)
    assert "retriedAs" not in await _get(kind, ids[0])
    members = (await kind.call("GET", NS + f"/groups/{gid}/instances")).body["items"]
    assert [(m["groupIndex"], m.get("attempt")) for m in members] == [(0, 1), (1, 1), (1, 2)]
