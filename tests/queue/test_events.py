"""The namespace event stream (``GET /v1/namespaces/{ns}/events``), on both backends: one event per
change of an instance, in commit order, each with its cursor; paging with ``after`` / ``limit``
never repeats or skips one; the filters; JSON lines and Server-Sent Events when followed (woken
by the commit, resumed with Last-Event-ID); a cursor older than retention is a 410; the same
authorization as every namespace route."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from nymph.protocol import now
from nymph.queue.models import OutputSettings, Role
from tests.support.dispatch_helpers import apply
from tests.support.queue_helpers import FAST, Queue, add_kind, open_queue

NS = "/v1/namespaces/default"
EVENTS = NS + "/events"
HOUR = 3600.0


@pytest.fixture
async def q(kind: Queue) -> Queue:
    """The queue with provider ``kind`` and a live daemon (seen by a claim before any launch), so
    that no launch waits for want of one (which would be an event too)."""
    assert await kind.daemon().claim(daemon_id="d1", node="n1", capacity=1, wait=0) == []
    return kind


async def _launch(q: Queue, provider: str = "kind") -> str:
    r = await q.call("POST", f"{NS}/providers/{provider}/launch", json_body={"mode": "small", "script": "1"})
    assert r.status == 202, r.body
    return str(r.body["instanceId"])


async def _page(q: Queue, query: str = "", *, status: int = 200) -> Any:
    r = await q.call("GET", EVENTS + query)
    assert r.status == status, r.body
    return r.body


def _brief(e: dict[str, Any]) -> tuple[Any, ...]:
    return (e["instanceId"], e["changes"], e["state"], e["reason"], e["node"], e["exitCode"])


async def _run_to_end(q: Queue, iid: str, *, code: int = 0) -> None:
    """Applied on n1 by d1, running, then stopped with ``code``."""
    d = q.daemon()
    assert await apply(d, daemon_id="d1", node="n1") == [iid]
    ended = {"exitCode": code, "terminationReason": "Completed" if code == 0 else "Error"}
    reports = [
        {"seq": 1, "instanceId": iid, "state": "running", "node": "n1"},
        {"seq": 2, "instanceId": iid, "state": "stopped", "reason": "Completed", "node": "n1", **ended},
    ]
    await d.report(daemon_id="d1", stream=f"s-{iid}", reports=reports)


async def test_each_change_is_one_event_oldest_first(q: Queue) -> None:
    iid = await _launch(q)
    await _run_to_end(q, iid, code=3)
    body = await _page(q)
    assert [_brief(e) for e in body["items"]] == [
        (iid, ["created", "state"], "queued", None, None, None),
        (iid, ["node"], "queued", None, "n1", None),
        (iid, ["state"], "running", None, "n1", None),
        (iid, ["exitCode"], "running", None, "n1", 3),
        (iid, ["state", "reason"], "stopped", "Completed", "n1", 3),
    ]
    cursors = [int(e["cursor"]) for e in body["items"]]
    assert cursors == sorted(cursors) and len(set(cursors)) == 5
    assert body["continue"] == body["items"][-1]["cursor"]
    first = body["items"][0]
    assert first["providerName"] == "kind" and first["namespace"] == "default"
    assert (first["attempt"], first["group"], first["waiting"], first["waitingKind"]) == (
        1,
        None,
        None,
        None,
    )
    # Reading on from any cursor gives exactly what follows it; nothing after the last one.
    rest = await _page(q, f"?after={cursors[1]}")
    assert [e["cursor"] for e in rest["items"]] == [str(c) for c in cursors[2:]]
    assert (await _page(q, f"?after={body['continue']}"))["items"] == []
    # Pages of two: the same events, each once, with continue (or after) between them.
    seen, cursor = [], ""
    for _ in range(4):
        page = await _page(q, f"?limit=2&continue={cursor}" if cursor else "?limit=2")
        seen += [e["cursor"] for e in page["items"]]
        cursor = page["continue"]
    assert seen == [str(c) for c in cursors]
    # A message alone (no state, reason, node) is no event: a second stop changes nothing.
    await q.user().stop(provider="kind", instance_id=iid)
    assert (await _page(q, f"?after={cursors[-1]}"))["items"] == []


async def test_filters_and_bad_queries(q: Queue) -> None:
    other = {"name": "other", "launcher": "Kube", "dispatch": "daemon", "kwargs": {"namespace": "jobs"}}
    assert (await q.call("POST", NS + "/providers", json_body=other)).status == 201
    a, b = await _launch(q), await _launch(q)
    mode2 = {"name": "tiny", "provider": "other", "fields": {"image": "busybox"}}
    assert (await q.call("POST", NS + "/modes", json_body=mode2)).status == 201
    r = await q.call("POST", NS + "/providers/other/launch", json_body={"mode": "tiny", "script": "1"})
    c = r.body["instanceId"]
    await q.user().stop(provider="kind", instance_id=a)
    ids = lambda body: [e["instanceId"] for e in body["items"]]  # noqa: E731
    assert ids(await _page(q)) == [a, b, c, a]
    assert ids(await _page(q, "?provider=kind")) == [a, b, a]
    assert ids(await _page(q, "?provider=other")) == [c]
    assert ids(await _page(q, f"?instance={a}")) == [a, a]
    assert ids(await _page(q, f"?provider=other&instance={a}")) == []
    r = await q.call(
        "POST", NS + "/providers/kind/launches", json_body={"mode": "small", "script": "1", "count": 3}
    )
    assert r.status == 202, r.body
    group, members = r.body["groupId"], [i["instanceId"] for i in r.body["instances"]]
    grouped = (await _page(q, f"?group={group}"))["items"]
    assert [(e["instanceId"], e["group"], e["attempt"], e["changes"]) for e in grouped] == [
        (m, group, 1, ["created", "state"]) for m in members
    ]
    assert (await q.call("DELETE", f"{NS}/groups/{group}")).status == 204
    stopped = (await _page(q, f"?group={group}&after={grouped[-1]['cursor']}"))["items"]
    assert sorted(e["instanceId"] for e in stopped) == sorted(members)
    assert {(e["state"], e["group"]) for e in stopped} == {("stopped", group)}
    none = await _page(q, "?group=g-1")
    # A quiet filter still moves on: continue is the newest event of the queue.
    assert none["items"] == [] and none["continue"] == (await _page(q))["continue"]
    for query, code in (
        ("?after=abc", "invalid_cursor"),
        ("?after=-1", "invalid_cursor"),
        ("?after=99999999999999999999", "invalid_cursor"),
        ("?limit=0", "invalid_query"),
        ("?limit=x", "invalid_query"),
        ("?follow=maybe", "invalid_query"),
        ("?after=1&continue=2", "invalid_query"),
    ):
        assert (await _page(q, query, status=400))["error"] == code, query


async def test_the_same_authorization_as_other_namespace_routes(q: Queue) -> None:
    iid = await _launch(q)
    team = await q.token(Role.USER, namespace="team-a")
    assert (await q.call("GET", EVENTS, token=None)).status == 401
    assert (await q.call("GET", EVENTS, token="daemon")).status == 403
    wrong = await q.call("GET", EVENTS, token=team)
    assert wrong.status == 403 and wrong.body["error"] == "wrong_namespace"
    own = await q.call("GET", "/v1/namespaces/team-a/events", token=team)
    assert own.status == 200 and own.body["items"] == []  # another namespace's events are not in it
    admin = await q.call("GET", EVENTS, token=q.admin_token)
    assert [e["instanceId"] for e in admin.body["items"]] == [iid]


async def _lines(resp: aiohttp.ClientResponse, count: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while len(out) < count:
        line = await asyncio.wait_for(resp.content.readline(), 10)
        assert line, "the stream ended"
        if line.strip():
            out.append(json.loads(line))
    return out


async def test_a_follower_gets_new_events_as_they_commit(q: Queue) -> None:
    before = await _launch(q)
    start = (await _page(q))["items"][0]["cursor"]
    headers = {"Authorization": f"Bearer {q.user_token}"}
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{q.url}{EVENTS}?follow=true&after={start}&provider=kind", headers=headers) as resp,
    ):
        assert resp.status == 200 and resp.content_type == "application/x-ndjson"
        iid = await _launch(q)
        [created] = await _lines(resp, 1)
        assert (created["instanceId"], created["changes"]) == (iid, ["created", "state"])
        await q.user().stop(provider="kind", instance_id=before)
        [stopped] = await _lines(resp, 1)
        assert (stopped["instanceId"], stopped["state"], stopped["reason"]) == (before, "stopped", "Stopped")
        assert int(created["cursor"]) > int(start) and int(stopped["cursor"]) > int(created["cursor"])


async def _sse(resp: aiohttp.ClientResponse, count: int) -> list[dict[str, str]]:
    """``count`` dispatched Server-Sent Events (their fields), skipping the retry and comments."""
    out: list[dict[str, str]] = []
    fields: dict[str, str] = {}
    while len(out) < count:
        line = (await asyncio.wait_for(resp.content.readline(), 10)).decode()
        assert line, "the stream ended"
        line = line.rstrip("\n")
        if not line:
            if "data" in fields:
                out.append(fields)
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(": ")
            fields[name] = value
    return out


async def test_server_sent_events_carry_the_cursor_and_resume_from_last_event_id(q: Queue) -> None:
    a, b = await _launch(q), await _launch(q)
    sse = {"Authorization": f"Bearer {q.user_token}", "Accept": "text/event-stream"}
    async with aiohttp.ClientSession() as http:
        async with http.get(q.url + EVENTS, headers=sse) as resp:
            assert resp.status == 200 and resp.content_type == "text/event-stream"
            assert resp.headers["Cache-Control"] == "no-cache"
            assert (await resp.content.readline()).decode() == "retry: 2000\n"
            first, second = await _sse(resp, 2)
        assert [json.loads(e["data"])["instanceId"] for e in (first, second)] == [a, b]
        assert first["id"] == json.loads(first["data"])["cursor"]
        # A reconnecting EventSource sends Last-Event-ID; it wins over the URL's own after.
        resumed = {**sse, "Last-Event-ID": first["id"]}
        async with http.get(f"{q.url}{EVENTS}?after=0", headers=resumed) as resp:
            await resp.content.readline()
            [again] = await _sse(resp, 1)
            assert again["id"] == second["id"]
            await q.user().stop(provider="kind", instance_id=a)
            [live] = await _sse(resp, 1)
            assert json.loads(live["data"])["state"] == "stopped" and int(live["id"]) > int(second["id"])
        bad = {**sse, "Last-Event-ID": "x1"}
        async with http.get(q.url + EVENTS, headers=bad) as resp:
            assert resp.status == 400 and (await resp.json())["error"] == "invalid_cursor"


@pytest.fixture
async def short(tmp_path: Path, queue_db: Path | str) -> AsyncIterator[Queue]:
    """A queue keeping events an hour (its own sweeper's expiry clock held at 1970), with a live
    daemon."""
    output = OutputSettings(retention_seconds=HOUR, purge_interval=0.0, expire_batch=1, expire_batches=2)
    q, runner = await open_queue(tmp_path, dataclasses.replace(FAST, output=output), db=queue_db)
    q.store.expiry.clock = lambda: 0.0
    await add_kind(q)
    assert await q.daemon().claim(daemon_id="d1", node="n1", capacity=1, wait=0) == []  # a live daemon
    try:
        yield q
    finally:
        await q.close()
        await runner.cleanup()


async def test_events_older_than_retention_go_and_a_cursor_before_them_says_so(short: Queue) -> None:
    old = [await _launch(short) for _ in range(3)]
    cursors = [e["cursor"] for e in (await _page(short))["items"]]
    age = now() - 2 * HOUR
    await short.store.db.write(lambda c: c.execute("UPDATE events SET at = ?", (age,)))
    new = await _launch(short)
    passed = await short.store.expiry.run(at=now())
    assert passed.events == 3  # the three old ones, oldest first (a prefix: the floor is their last)
    body = await _page(short)
    assert [e["instanceId"] for e in body["items"]] == [new]
    gone = await _page(short, f"?after={cursors[0]}", status=410)
    assert gone["error"] == "cursor_expired" and "--retention-days" in gone["detail"]
    # The last removed cursor is still good: nothing after it is lost.
    assert [e["instanceId"] for e in (await _page(short, f"?after={cursors[-1]}"))["items"]] == [new]
    followed = await short.call("GET", f"{EVENTS}?after={cursors[1]}&follow=true")
    assert followed.status == 410 and followed.body["error"] == "cursor_expired"
    assert all(e["instanceId"] not in old for e in body["items"])


async def test_a_waiting_reason_is_an_event_when_its_kind_changes_only(kind: Queue) -> None:
    iid = await _launch(kind)
    start = (await _page(kind))["items"][0]["cursor"]  # its creation (the sweeper may have run since)
    for _ in range(3):  # no live daemon: the first sweep gives it a reason, the others the same
        await kind.store.sweep()
    [waiting] = (await _page(kind, f"?after={start}"))["items"]
    assert (waiting["changes"], waiting["state"], waiting["waitingKind"]) == (
        ["waiting"],
        "queued",
        "NoDaemon",
    )
    assert waiting["waiting"] == "no live daemon serves this kube namespace"
    # A daemon applies it on its node: it no longer waits (one event says both).
    assert await apply(kind.daemon(), daemon_id="d1", node="n1") == [iid]
    await kind.store.sweep()
    later = (await _page(kind, f"?after={waiting['cursor']}"))["items"]
    got = [(e["changes"], e["waiting"], e["waitingKind"], e["node"]) for e in later]
    # the sweep may find it claimed (so no longer waiting) before the daemon says it applied it
    assert got in (
        [(["node", "waiting"], None, None, "n1")],
        [(["waiting"], None, None, None), (["node"], None, None, "n1")],
    ), got


async def test_a_retry_is_a_new_attempts_creation_right_after_the_failure(q: Queue) -> None:
    mode = {
        "name": "retried",
        "provider": "kind",
        "fields": {"image": "busybox", "retry": {"limit": 1, "on": ["Error"]}},
    }
    assert (await q.call("POST", NS + "/modes", json_body=mode)).status == 201
    r = await q.call("POST", NS + "/providers/kind/launch", json_body={"mode": "retried", "script": "1"})
    iid = r.body["instanceId"]
    d = q.daemon()
    assert await apply(d, daemon_id="d1", node="n1") == [iid]
    failed = {"seq": 1, "instanceId": iid, "state": "stopped", "reason": "Error", "node": "n1"}
    await d.report(daemon_id="d1", stream="s", reports=[failed])
    items = (await _page(q))["items"]
    stop, retry = items[-2:]
    assert (stop["instanceId"], stop["state"], stop["reason"], stop["attempt"]) == (
        iid,
        "stopped",
        "Error",
        1,
    )
    assert retry["instanceId"] != iid and int(retry["cursor"]) > int(stop["cursor"])
    assert (retry["changes"], retry["state"], retry["attempt"]) == (
        ["created", "state", "attempt"],
        "queued",
        2,
    )
