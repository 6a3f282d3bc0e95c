"""fsyncs per launch: outbox items are written at once and fsynced together, once before they
are sent (off the event loop); the daemon's audit log (grouped) likewise, before a batch of
tasks acts and before any send; a plain audit log fsyncs each append; the outbox's ack and the
audit log's head, which may lag, add none."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from nymph.daemon import outbox as outbox_module
from nymph.daemon.audit import AuditLog, verify
from nymph.daemon.outbox import Outbox

IID = "lakeshore-0123abcd"


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    count = [0]
    real = os.fsync

    def counted(fd: int) -> None:
        count[0] += 1
        real(fd)

    monkeypatch.setattr(os, "fsync", counted)
    return count


async def _send_all(box: Outbox) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def send(_kind: str, batch: list[dict[str, Any]]) -> None:
        sent.extend(batch)

    task = asyncio.create_task(box.run(send))
    try:
        assert await box.flush(5)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return sent


async def test_sending_and_acking_costs_one_fsync_for_all_the_appends(
    tmp_path: Path, fsyncs: list[int]
) -> None:
    box = Outbox(tmp_path)
    for state in ("starting", "running", "stopped"):
        box.report(instance_id=IID, state=state)
    box.complete(task_id="task-1", ok=True)
    assert fsyncs[0] == 0
    sent = await _send_all(box)
    assert len(sent) == 4 and fsyncs[0] == 1
    # What was acknowledged is not sent again after a restart.
    assert Outbox(tmp_path).pending == 0
    box.report(instance_id=IID, state="stopped")
    again = Outbox(tmp_path)
    assert [i.get("state") for i in again.mem] == ["stopped"]


async def test_a_lagging_ack_resends_and_never_skips(tmp_path: Path) -> None:
    box = Outbox(tmp_path)
    box.report(instance_id=IID, state="running")
    await _send_all(box)
    box.report(instance_id=IID, state="stopped")
    (tmp_path / "outbox.ack").write_text("")  # an ack lost to a power cut
    assert [i.get("state") for i in Outbox(tmp_path).mem] == ["running", "stopped"]


async def test_the_file_is_emptied_durably_once_enough_lines_were_sent(
    tmp_path: Path, fsyncs: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(outbox_module, "RESET_LINES", 3)
    box = Outbox(tmp_path)
    for _ in range(2):
        box.report(instance_id=IID, state="running")
    await _send_all(box)
    assert (tmp_path / "outbox.jsonl").stat().st_size > 0 and fsyncs[0] == 1
    box.report(instance_id=IID, state="stopped")
    await _send_all(box)
    assert (tmp_path / "outbox.jsonl").read_bytes() == b""
    assert fsyncs[0] > 2  # the truncate and the reset ack are fsynced
    assert Outbox(tmp_path).pending == 0


def test_an_audit_record_costs_one_fsync_and_the_chain_still_verifies(
    tmp_path: Path, fsyncs: list[int]
) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    before = fsyncs[0]
    for i in range(5):
        log.append("claim", task=f"t{i}")
    assert fsyncs[0] - before == 5
    assert verify(tmp_path / "audit.jsonl").ok
    # A head left behind (not fsynced, lost) is caught up at the next open, not an alarm.
    head = {"seq": 2, "hash": _hash_of(tmp_path, 2)}
    (tmp_path / "audit.jsonl.head").write_text(json.dumps(head))
    AuditLog(tmp_path / "audit.jsonl").append("claim", task="t9")
    assert verify(tmp_path / "audit.jsonl").ok


def _hash_of(tmp: Path, seq: int) -> str:
    for line in (tmp / "audit.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["seq"] == seq:
            return str(rec["hash"])
    raise AssertionError(seq)


def test_grouped_audit_records_are_written_at_once_and_made_durable_by_one_sync(
    tmp_path: Path, fsyncs: list[int]
) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path, grouped=True)
    before = fsyncs[0]
    for i in range(5):
        log.append("claim", task=f"t{i}")
    assert fsyncs[0] == before  # nothing fsynced yet ...
    assert len(path.read_text().splitlines()) == 5  # ... but every record is in the file
    assert log.unsynced == 5
    assert log.sync() == 5 and fsyncs[0] == before + 1
    assert json.loads((tmp_path / "audit.jsonl.head").read_text())["seq"] == 5
    assert log.sync() == 0 and fsyncs[0] == before + 1  # nothing new: no fsync
    assert verify(path).ok


def test_a_grouped_audit_log_killed_before_its_sync_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path, grouped=True)
    log.append("claim", task="t0")
    log.sync()
    for i in range(1, 4):
        log.append("apply", task=f"t{i}", result="ok")
    del log  # a kill: the head still says 1
    again = AuditLog(path, grouped=True)
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r.get("task") for r in recs[:4]] == ["t0", "t1", "t2", "t3"]
    assert recs[-1]["event"] == "head-recovered" and recs[-1]["records"] == 3
    again.sync()
    assert verify(path).ok and verify(path).notes == ()


async def test_the_outbox_sends_nothing_until_the_audit_log_is_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    audit = AuditLog(tmp_path / "audit.jsonl", grouped=True)
    box = Outbox(tmp_path / "state")
    box.also_sync = audit
    audit.append("apply", task="task-1", result="ok")
    box.complete(task_id="task-1", ok=True)
    real = os.fsync
    broken = [True]

    def fsync(fd: int) -> None:
        if broken[0] and os.readlink(f"/proc/self/fd/{fd}").endswith("audit.jsonl"):
            raise OSError(5, "Input/output error")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    sent: list[dict[str, Any]] = []

    async def send(_kind: str, batch: list[dict[str, Any]]) -> None:
        sent.extend(batch)

    task = asyncio.create_task(box.run(send))
    try:
        assert not await box.flush(1.0)
        assert sent == [] and audit.unsynced == 1
        broken[0] = False  # the disk is back: the record is made durable, then the item sent
        assert await box.flush(10.0)
        assert [i["taskId"] for i in sent] == ["task-1"] and audit.unsynced == 0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
