"""Instances' logs as chunks over real HTTP: offsets, de-duplication, the cap and its marker,
retention, and a log followed live while a daemon ships it."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from nymph.client.errors import QueueConflict, QueueNotFound
from nymph.client.logs import follow_log
from nymph.launch.logcap import marker
from nymph.queue.models import OutputSettings
from tests.support.dispatch_helpers import apply
from tests.support.queue_helpers import FAST, Queue, add_kind, open_queue

NS = "/v1/namespaces/default"
INSTANCES = NS + "/providers/kind/instances"
CAP = 4096


@pytest.fixture
async def small(tmp_path: Path) -> AsyncIterator[Queue]:
    """A queue keeping 4 KiB of log per instance, expiring output at once, purging every sweep."""
    settings = dataclasses.replace(
        FAST,
        output=OutputSettings(
            log_cap_bytes=CAP,
            results_cap_bytes=CAP,
            retention_seconds=0.0,
            purge_interval=0.0,
            follow_grace_seconds=1.0,
        ),
    )
    q, runner = await open_queue(tmp_path, settings)
    await add_kind(q)
    try:
        yield q
    finally:
        await q.close()
        await runner.cleanup()


async def _launch(q: Queue) -> str:
    """A launch applied by daemon ``d1`` (which knows no node: any session of that id writes it)."""
    r = await q.call("POST", NS + "/providers/kind/launch", json_body={"mode": "small", "script": "print(1)"})
    assert r.status == 202, r.body
    assert await apply(q.daemon(), daemon_id="d1", node="") == [r.body["instanceId"]]
    return str(r.body["instanceId"])


async def _stop(q: Queue, iid: str) -> None:
    d = q.daemon()
    await d.report(
        daemon_id="d1",
        stream="s",
        reports=[{"seq": 1, "instanceId": iid, "state": "stopped", "reason": "Completed", "node": "n1"}],
    )


async def test_chunks_are_offsets_of_the_printed_log(small: Queue) -> None:
    iid = await _launch(small)
    d = small.daemon()
    await d.ship_log_chunk(daemon_id="d1", instance_id=iid, offset=0, data=b"one\ntwo\n")
    # a resend overlapping what arrived adds only its new part; a full repeat adds nothing
    await d.ship_log_chunk(daemon_id="d1", instance_id=iid, offset=4, data=b"two\nthree\n")
    ack = await d.ship_log_chunk(daemon_id="d1", instance_id=iid, offset=0, data=b"one\n")
    assert ack["size"] == len(b"one\ntwo\nthree\n")
    assert await small.user().get_logs(provider="kind", instance_id=iid) == "one\ntwo\nthree\n"
    with pytest.raises(QueueConflict):
        await d.ship_log_chunk(daemon_id="d1", instance_id=iid, offset=99, data=b"gap")
    r = await small.call("GET", f"{INSTANCES}/{iid}/logs?since=8")
    assert r.body == {"instanceId": iid, "logs": "three\n"}
    with pytest.raises(QueueNotFound):
        await d.ship_log_chunk(daemon_id="d1", instance_id="lakeshore-00000000", offset=0, data=b"x")


async def test_the_cap_drops_the_oldest_middle_with_a_marker(small: Queue) -> None:
    iid = await _launch(small)
    d = small.daemon()
    log = b"".join(b"line %06d\n" % i for i in range(2000))  # 24000 bytes
    for start in range(0, len(log), 1000):
        await d.ship_log_chunk(daemon_id="d1", instance_id=iid, offset=start, data=log[start : start + 1000])
    head = CAP // 4
    dropped = len(log) - CAP
    expected = log[:head] + marker(dropped) + log[head + dropped :]
    r = await small.call("GET", f"{INSTANCES}/{iid}/logs?follow=false", headers={"Accept": "text/plain"})
    assert r.status == 200 and r.text.encode() == expected
    whole = await small.user().get_logs(provider="kind", instance_id=iid)
    assert whole is not None and whole.encode() == expected
    # offsets keep their meaning: the last line is where the job printed it
    last = len(log) - 12
    r = await small.call("GET", f"{INSTANCES}/{iid}/logs?since={last}")
    assert r.body["logs"] == "line 001999\n"


async def test_a_followed_log_streams_live_and_ends_with_the_log(small: Queue) -> None:
    iid = await _launch(small)
    d = small.daemon()
    got: list[bytes] = []
    follower = asyncio.create_task(
        follow_log(small.user(), provider="kind", instance_id=iid, write=got.append)
    )
    await d.ship_log_chunk(daemon_id="d1", instance_id=iid, offset=0, data=b"first\n")
    for _ in range(100):
        if b"".join(got) == b"first\n":
            break
        await asyncio.sleep(0.05)
    assert b"".join(got) == b"first\n" and not follower.done()  # live, before the job ends
    await d.ship_log_chunk(daemon_id="d1", instance_id=iid, offset=6, data=b"second\n", final=True)
    reached = await asyncio.wait_for(follower, 10)
    assert b"".join(got) == b"first\nsecond\n" and reached == len(b"first\nsecond\n")
    # a reader resuming at an offset gets the rest only
    rest: list[bytes] = []
    await follow_log(small.user(), provider="kind", instance_id=iid, write=rest.append, since=6)
    assert b"".join(rest) == b"second\n"


async def test_a_follow_ends_for_a_stopped_instance_without_a_log(small: Queue) -> None:
    iid = await _launch(small)
    await _stop(small, iid)
    got: list[bytes] = []
    await asyncio.wait_for(follow_log(small.user(), provider="kind", instance_id=iid, write=got.append), 10)
    assert got == []


async def test_output_is_removed_after_the_retention_period(small: Queue) -> None:
    iid = await _launch(small)
    other = await _launch(small)
    d = small.daemon()
    for i in (iid, other):
        await d.ship_log_chunk(daemon_id="d1", instance_id=i, offset=0, data=b"kept?\n")
    await _stop(small, iid)
    await small.store.sweep()
    # the stopped instance expired with its output (retention 0): its log is a 404 saying so
    with pytest.raises(QueueNotFound) as gone:
        await small.user().get_logs(provider="kind", instance_id=iid)
    assert gone.value.code == "instance_expired"
    assert await small.user().get_logs(provider="kind", instance_id=other) == "kept?\n"  # still running


async def test_the_instance_keeps_how_its_container_ended(kind: Queue) -> None:
    """A stopped instance keeps its container's exit code, termination reason and message, and a
    later report does not change them (on a queue that keeps stopped instances: the small one
    here expires them at once, racing the reads)."""
    iid = await _launch(kind)
    report = {
        "seq": 1,
        "instanceId": iid,
        "state": "stopped",
        "reason": "Error",
        "node": "n1",
        "exitCode": 3,
        "terminationReason": "Error",
        "terminationMessage": "bad input",
    }
    await kind.daemon().report(daemon_id="d1", stream="s", reports=[report])
    inst = await kind.user().get_instance(provider="kind", instance_id=iid)
    assert (inst.get("exitCode"), inst.get("terminationReason"), inst.get("terminationMessage")) == (
        3,
        "Error",
        "bad input",
    )
    # a later word on it does not change it
    again = {**report, "seq": 2, "exitCode": 0}
    await kind.daemon().report(daemon_id="d1", stream="s", reports=[again])
    assert (await kind.user().get_instance(provider="kind", instance_id=iid)).get("exitCode") == 3


async def test_results_over_the_cap_are_dropped_and_said(small: Queue) -> None:
    iid = await _launch(small)
    d = small.daemon()
    await d.upload_result(daemon_id="d1", instance_id=iid, path="ok.txt", data=b"fine", eof=True)
    await d.upload_result(daemon_id="d1", instance_id=iid, path="huge.bin", data=b"x" * 4000)
    with pytest.raises(QueueConflict):
        await d.upload_result(daemon_id="d1", instance_id=iid, path="huge.bin", offset=4000, data=b"x" * 100)
    listed = await small.call("GET", f"{INSTANCES}/{iid}/results")
    assert listed.body["items"] == [{"path": "ok.txt", "size": 4}]
    assert "exceed the cap" in listed.body["error"]
    inst = await small.user().get_instance(provider="kind", instance_id=iid)
    assert "huge.bin" in inst.get("resultsError", "")
