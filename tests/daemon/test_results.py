"""Which files of a workdir's out/ are results: regular files within the cap, never a symlink
or anything outside the workdir; and where a download may write."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nymph.client.results import target
from nymph.daemon.results import collect, read_chunks
from nymph.launch.results import BadResultPath, check_result_path


def test_collect_keeps_regular_files_and_refuses_the_rest(tmp_path: Path) -> None:
    work = tmp_path / "work" / "lakeshore-1"
    out = work / "out"
    (out / "sub").mkdir(parents=True)
    (out / "a.txt").write_bytes(b"A" * 10)
    (out / "sub" / "b.bin").write_bytes(b"B" * 20)
    secret = tmp_path / "secret"
    secret.write_text("no")
    (out / "link").symlink_to(secret)
    (out / "dirlink").symlink_to(tmp_path)
    os.mkfifo(out / "fifo")
    (out / "big").write_bytes(b"C" * 100)
    found, problems = collect(work, cap=40)
    assert [(f.path, f.size) for f in found] == [("a.txt", 10), ("sub/b.bin", 20)]
    text = "; ".join(problems)
    assert "link: a symlink" in text and "dirlink: a symlink" in text
    assert "fifo: not a regular file" in text and "big: over the results cap" in text
    assert read_chunks(out / "a.txt", size=10) == [(0, b"A" * 10)]
    with pytest.raises(OSError):
        read_chunks(out / "link", size=2)  # O_NOFOLLOW: a symlink swapped in reads nothing


def test_an_out_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    work = tmp_path / "w"
    work.mkdir()
    (work / "out").symlink_to(tmp_path)
    found, problems = collect(work, cap=1 << 20)
    assert found == [] and "not a directory" in problems[0]
    assert collect(tmp_path / "none", cap=1) == ([], [])


@pytest.mark.parametrize("bad", ["", "/abs", "a/../b", "./a", "a//b", "..", "a\\b", "a\x00b"])
def test_bad_result_paths(bad: str, tmp_path: Path) -> None:
    with pytest.raises(BadResultPath):
        check_result_path(bad)
    with pytest.raises(BadResultPath):
        target(tmp_path, bad)


def test_downloads_stay_under_the_directory(tmp_path: Path) -> None:
    assert target(tmp_path, "a/b.txt") == (tmp_path / "a" / "b.txt").resolve()
    (tmp_path / "esc").symlink_to("/")
    with pytest.raises(BadResultPath):
        target(tmp_path, "esc/etc/passwd")
