"""The daemon's append-only state files (the outbox, the audit log) are written through one
descriptor held open, not an open and a close per record and per sync; a write that fails
still leaves the file as it was; a file removed meanwhile is made again by the next append, and
one the outbox replaces when it compacts is the one written after."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from nymph.daemon import durable
from nymph.daemon.audit import AuditLog, verify
from nymph.daemon.durable import Appender
from nymph.daemon.outbox import Outbox

IID = "lakeshore-0001"


def _count_opens(monkeypatch: pytest.MonkeyPatch, path: Path) -> list[str]:
    opened: list[str] = []
    real = os.open

    def counting(p: Any, *args: Any, **kwargs: Any) -> int:
        if Path(p) == path:
            opened.append(str(p))
        return real(p, *args, **kwargs)

    monkeypatch.setattr(durable.os, "open", counting)
    return opened


def test_appends_and_syncs_go_through_one_open_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "log.jsonl"
    opened = _count_opens(monkeypatch, path)
    out = Appender(path)
    starts = [out.append(f"{i}\n".encode(), sync=i % 10 == 0) for i in range(50)]
    out.fsync()
    assert len(opened) == 1
    assert path.read_bytes() == b"".join(f"{i}\n".encode() for i in range(50))
    assert starts == [len(b"".join(f"{j}\n".encode() for j in range(i))) for i in range(50)]
    out.close()


def test_a_failed_write_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    out = Appender(path)
    out.append(b"whole\n")

    def half(fd: int, data: bytes) -> int:
        os.write(fd, data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        out.append(b"a record cut in half\n", write=half)
    out.append(b"next\n")
    assert path.read_bytes() == b"whole\nnext\n"


def test_a_file_removed_meanwhile_is_made_again(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    out = Appender(path)
    out.append(b"first\n")
    path.unlink()
    out.append(b"second\n")
    out.fsync()
    assert path.read_bytes() == b"second\n"


async def test_the_outbox_writes_to_the_file_its_compaction_put_in_place(tmp_path: Path) -> None:
    box = Outbox(tmp_path, compact_after=3)
    for i in range(8):
        box.report(instance_id=IID, state="running", message=str(i))
    sent: list[str] = []

    async def send_five(kind: str, batch: list[dict[str, Any]]) -> None:
        if len(sent) >= 5:
            raise OSError("the queue went away")
        sent.extend(b["message"] for b in batch)

    box.batch_max = 1
    task = asyncio.create_task(box.run(send_five))
    await asyncio.sleep(0.3)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert sent == [str(i) for i in range(5)]
    before = (tmp_path / "outbox.jsonl").stat().st_ino
    box.report(instance_id=IID, state="stopped", message="after the compaction")
    assert (tmp_path / "outbox.jsonl").stat().st_ino == before
    again = Outbox(tmp_path)
    rest: list[str] = []

    async def send(kind: str, batch: list[dict[str, Any]]) -> None:
        rest.extend(b["message"] for b in batch)

    task = asyncio.create_task(again.run(send))
    assert await again.flush(timeout=5)
    task.cancel()
    assert rest == [*(str(i) for i in range(5, 8)), "after the compaction"]


def test_the_audit_log_appends_and_syncs_through_one_open_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "audit.jsonl"
    audit = AuditLog(path, grouped=True)
    opened = _count_opens(monkeypatch, path)
    for i in range(20):
        audit.append("apply", instance=f"i-{i}")
        if i % 5 == 4:
            assert audit.sync() == 5
    assert len(opened) <= 1
    checked = verify(path)
    assert checked.ok and checked.records >= 20, checked
