"""The daemon's mark book: marks survive a restart, a forgotten one stays forgotten, a torn
last line or a stray line is skipped, the file is rewritten with the live marks once it holds
many more lines, a write that fails leaves the mark as it was and the file usable, and files an
earlier version kept one per instance are taken in (and removed) once."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from nymph.daemon import marks
from nymph.daemon.marks import MarkBook


def half_a_line(code: int) -> Callable[[int, bytes], int]:
    """A write that puts half its bytes in, then fails with ``code``."""
    real_write = os.write

    def write(fd: int, data: bytes) -> int:
        real_write(fd, data[: len(data) // 2])
        raise OSError(code, os.strerror(code))

    return write


def test_marks_survive_a_restart_and_forgotten_ones_stay_forgotten(tmp_path: Path) -> None:
    book = MarkBook(tmp_path / "m")
    book.put("a", {"cursor": "1 - 0", "final": False})
    book.put("b", {})
    book.put("a", {"cursor": "9 - 0", "final": True})
    book.drop("b")
    book.drop("never-there")  # nothing to forget: nothing written
    book.close()
    again = MarkBook(tmp_path / "m")
    assert again.marks == {"a": {"cursor": "9 - 0", "final": True}}
    assert "b" not in again and again.get("b") is None
    assert again.lines == 4


def test_a_torn_last_line_and_stray_lines_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "m"
    book = MarkBook(path)
    book.put("a", {"x": 1})
    book.put("b", {"x": 2})
    book.close()
    with path.open("ab") as fh:
        fh.write(b'[1, 2]\n{"v": {}}\n\xff\xfe\n{"n": "c", "v": {"x"')  # the last one cut short
    again = MarkBook(path)
    assert again.marks == {"a": {"x": 1}, "b": {"x": 2}}
    again.put("c", {"x": 3})  # appended after the torn line, on a line of its own
    again.close()
    assert MarkBook(path).marks == {"a": {"x": 1}, "b": {"x": 2}, "c": {"x": 3}}


@pytest.fixture
def compacting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where a book is rewritten from 40 lines on (4,096 in the daemon)."""
    monkeypatch.setattr(marks, "MIN_LINES_TO_COMPACT", 40)
    return tmp_path / "m"


def test_the_file_is_rewritten_with_the_live_marks_when_it_holds_many_more_lines(compacting: Path) -> None:
    path = compacting
    book = MarkBook(path)
    book.put("keep", {"k": True})
    for i in range(30):
        book.put(f"i{i}", {})
        book.drop(f"i{i}")
    # 61 lines were written; the file was rewritten on the way, and holds what the book counts
    assert book.lines < 40
    assert len(path.read_bytes().splitlines()) == book.lines
    book.put("after", {})
    book.close()
    assert MarkBook(path).marks == {"keep": {"k": True}, "after": {}}


def test_a_mark_rewritten_often_does_not_grow_the_file_without_bound(compacting: Path) -> None:
    """A long log's cursor moves at every chunk, with no Pod deleted in between."""
    book = MarkBook(compacting)
    for offset in range(500):
        book.put("long-log", {"cursor": f"{offset} - 0"})
    book.close()
    assert len(compacting.read_bytes().splitlines()) < 40
    assert MarkBook(compacting).marks == {"long-log": {"cursor": "499 - 0"}}


@pytest.fixture
def one_mark(tmp_path: Path) -> tuple[Path, MarkBook]:
    """A book holding the mark ``a`` = ``{"x": 1}``."""
    book = MarkBook(tmp_path / "m")
    book.put("a", {"x": 1})
    return tmp_path / "m", book


def test_a_line_whose_cut_failed_does_not_swallow_the_next(
    one_mark: tuple[Path, MarkBook], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, book = one_mark
    half = half_a_line(errno.EIO)

    def refuse(fd: int, size: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    with monkeypatch.context() as m:
        m.setattr(os, "write", half)
        m.setattr(os, "ftruncate", refuse)
        with pytest.raises(OSError):
            book.put("b", {"x": 2})
    book.put("c", {"x": 3})
    book.close()
    assert MarkBook(path).marks == {"a": {"x": 1}, "c": {"x": 3}}


def test_an_unreadable_book_is_taken_as_empty(tmp_path: Path) -> None:
    path = tmp_path / "m"
    path.mkdir()  # reading it fails (a directory), as an unreadable file would
    assert MarkBook(path).marks == {}


def test_taking_files_in_stops_on_a_full_disk_and_leaves_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = tmp_path / "results"
    old.mkdir()
    for name in ("lakeshore-00000001", "lakeshore-00000002"):
        (old / name).write_text("done")
    book = MarkBook(tmp_path / "results.marks")

    def full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(os, "write", full)
        assert book.adopt(old, lambda p: (p.name, {})) == 0
    assert sorted(p.name for p in old.iterdir()) == ["lakeshore-00000001", "lakeshore-00000002"]
    assert book.adopt(old, lambda p: (p.name, {})) == 2  # the next start takes them


def test_a_failed_write_leaves_the_mark_and_the_file_as_they_were(
    one_mark: tuple[Path, MarkBook], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, book = one_mark
    before = path.read_bytes()
    monkeypatch.setattr(os, "write", half_a_line(errno.ENOSPC))
    with pytest.raises(OSError, match="No space"):
        book.put("a", {"x": 2})
    with pytest.raises(OSError, match="No space"):
        book.put("b", {"x": 3})
    monkeypatch.undo()
    assert book.marks == {"a": {"x": 1}}
    assert path.read_bytes() == before  # the half lines were cut
    book.put("b", {"x": 4})
    book.close()
    assert MarkBook(path).marks == {"a": {"x": 1}, "b": {"x": 4}}


def test_files_kept_one_per_instance_are_taken_in_once(tmp_path: Path) -> None:
    old = tmp_path / "results"
    old.mkdir()
    for name in ("lakeshore-00000001", "lakeshore-00000002"):
        (old / name).write_text("done")
    (old / ".lakeshore-00000003.tmp").write_text("half")
    book = MarkBook(tmp_path / "results.marks")
    book.put("lakeshore-00000002", {"kept": True})  # what the book holds already wins

    def read(path: Path) -> tuple[str, dict[str, Any]] | None:
        return (path.name, {}) if path.read_text() == "done" else None

    assert book.adopt(old, read) == 2
    assert not old.exists()
    assert book.marks == {"lakeshore-00000001": {}, "lakeshore-00000002": {"kept": True}}
    assert book.adopt(old, read) == 0  # nothing left to take
    book.close()
    assert MarkBook(tmp_path / "results.marks").marks == book.marks


def test_a_file_that_cannot_be_read_stays_for_the_next_start(tmp_path: Path) -> None:
    old = tmp_path / "logs"
    old.mkdir()
    (old / "bad.json").write_text("{not json")
    (old / "good.json").write_text("{}")
    book = MarkBook(tmp_path / "logs.marks")

    def read(path: Path) -> tuple[str, dict[str, Any]] | None:
        import json

        return path.stem, json.loads(path.read_text())

    assert book.adopt(old, read) == 1
    assert sorted(p.name for p in old.iterdir()) == ["bad.json"]
    assert book.marks == {"good": {}}


names = st.sampled_from(["a", "b", "c", "lakeshore-0123abcd"])
ops = st.lists(
    st.tuples(
        names, st.one_of(st.none(), st.dictionaries(st.sampled_from(["cursor", "final"]), st.integers()))
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(ops=ops)
@example(ops=[("a", {"cursor": -(2**63) - 1}), ("b", {"final": 2**64})])  # past 64 bits: exact
def test_what_is_read_back_is_what_was_written(
    tmp_path_factory: pytest.TempPathFactory, ops: list[Any]
) -> None:
    path = tmp_path_factory.mktemp("marks") / "m"
    book = MarkBook(path)
    expect: dict[str, Any] = {}
    for name, value in ops:
        if value is None:
            book.drop(name)
            expect.pop(name, None)
        else:
            book.put(name, value)
            expect[name] = value
    book.close()
    assert book.marks == expect
    assert MarkBook(path).marks == expect


def test_only_the_marks_of_live_instances_are_kept(tmp_path: Path) -> None:
    """Marks of Pods that went while the daemon was down are forgotten, on disk too."""
    book = MarkBook(tmp_path / "m")
    for name in ("alive", "gone-1", "gone-2"):
        book.put(name, {})
    assert book.keep_only({"alive", "not-marked"}) == 2
    book.close()
    assert MarkBook(tmp_path / "m").marks == {"alive": {}}
