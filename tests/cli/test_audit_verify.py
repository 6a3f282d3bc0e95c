"""``nymph audit verify`` takes the log or the daemon's root directory, never ends in a
traceback, and says when the end of a log could not be checked."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from nymph.cli import main
from nymph.daemon.audit import AuditLog


def _root_with_log(tmp_path: Path, records: int = 3) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    log = AuditLog(root / "audit.jsonl")
    for n in range(records):
        log.append("claim", instance=f"lakeshore-0000000{n}")
    return root


def test_the_daemon_root_directory_verifies_the_log_in_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _root_with_log(tmp_path)
    assert main(["audit", "verify", str(root)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ok: 3 records, chain intact\n") and "unchecked" not in out


def test_a_directory_without_a_log_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["audit", "verify", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("FAILED: ") and "audit.jsonl" in err and "Traceback" not in err


def test_a_log_copied_without_its_head_says_its_end_is_unchecked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _root_with_log(tmp_path)
    copy = tmp_path / "copy.jsonl"
    shutil.copy(root / "audit.jsonl", copy)
    assert main(["audit", "verify", str(copy)]) == 0
    out = capsys.readouterr().out
    assert "ok: 3 records, chain intact; its end is unchecked (no copy.jsonl.head beside it)" in out
    assert "records removed from the end" in out

    (tmp_path / "copy.jsonl.head").write_text("not json")
    assert main(["audit", "verify", str(copy)]) == 0
    assert "its end is unchecked (copy.jsonl.head cannot be read)" in capsys.readouterr().out
