"""The daemon's append-only state files (the outbox, the audit log) are written through one
descriptor held open, not an open and a close per record and per sync; a write that fails
still leaves the file as it was; a file removed meanwhile is made again by the next append
(the outbox's compaction, which replaces its file, is in ``test_outbox_logs.py``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from nymph.daemon import durable
from nymph.daemon.audit import AuditLog, verify
from nymph.daemon.durable import Appender

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
