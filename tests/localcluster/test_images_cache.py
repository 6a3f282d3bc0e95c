"""The local image cache: apt sources, keys, atomic builds, and the pause image itself."""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import signal
import struct
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from nymph.localcluster import images as images_module
from nymph.localcluster.images import (
    PAUSE_IMAGE,
    ImageBuildError,
    cached_archive,
    debian_mirror,
    ensure_pause_image,
    parse_apt_sources,
    prune,
    prune_after_build,
    recipe_key,
)
from nymph.localcluster.oci import blob_path

ONE_LINE = """\
# deb http://old.example/debian buster main
deb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian bookworm main contrib
deb-src http://mirror.example/debian bookworm main
deb http://mirror.example/debian-security bookworm-security main
"""

DEB822 = """\
Types: deb
# a comment
URIs: http://deb.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.example/debian-security
Suites: bookworm-security
Components: main

Types: deb
URIs: http://disabled.example/debian
Suites: trixie
Enabled: no
"""


def test_parse_one_line_sources() -> None:
    assert parse_apt_sources(ONE_LINE, deb822=False) == [
        ("http://mirror.example/debian", ["bookworm"]),
        ("http://mirror.example/debian-security", ["bookworm-security"]),
    ]


def test_parse_deb822_sources() -> None:
    assert parse_apt_sources(DEB822, deb822=True) == [
        ("http://deb.example/debian", ["bookworm", "bookworm-updates"]),
        ("http://deb.example/debian-security", ["bookworm-security"]),
    ]


def test_debian_mirror_skips_security_and_disabled(tmp_path: Path) -> None:
    d = tmp_path / "sources.list.d"
    d.mkdir()
    (d / "a-security.sources").write_text(
        "Types: deb\nURIs: http://sec.example/debian-security\nSuites: bookworm-security\n"
    )
    (d / "b.list.disabled").write_text("deb http://no.example/debian bookworm main\n")
    (d / "c.sources").write_text(DEB822)
    assert debian_mirror(sources=[tmp_path / "sources.list", d]) == "http://deb.example/debian"


def test_debian_mirror_missing_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ImageBuildError, match="no Debian archive"):
        debian_mirror(sources=[tmp_path / "nothing"])


def test_recipe_key_changes_with_each_part() -> None:
    assert recipe_key("x", "a", "b") == recipe_key("x", "a", "b")
    assert recipe_key("x", "a", "b") != recipe_key("x", "ab")
    assert recipe_key("x", "a") != recipe_key("x", "b")
    assert recipe_key("x", "a").startswith("x-")


def test_cached_archive_builds_once(tmp_path: Path) -> None:
    calls: list[Path] = []

    def build(tmp: Path) -> None:
        calls.append(tmp)
        (tmp / "work").mkdir()
        (tmp / "work" / "scratch").write_text("big")
        (tmp / "image.tar").write_bytes(b"archive")

    first = cached_archive("k-1", build, root=tmp_path)
    second = cached_archive("k-1", build, root=tmp_path)
    assert first == second == tmp_path / "k-1" / "image.tar"
    assert len(calls) == 1
    assert first.read_bytes() == b"archive"
    assert sorted(p.name for p in (tmp_path / "k-1").iterdir()) == ["image.tar"]  # no scratch
    assert not list(tmp_path.glob(".tmp-*"))


def test_failed_build_leaves_no_image(tmp_path: Path) -> None:
    def build(tmp: Path) -> None:
        (tmp / "image.tar").write_bytes(b"half")
        raise ImageBuildError("boom")

    with pytest.raises(ImageBuildError, match="boom"):
        cached_archive("k-2", build, root=tmp_path)
    assert not (tmp_path / "k-2").exists()
    assert not list(tmp_path.glob(".tmp-*"))


def test_build_without_archive_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ImageBuildError, match="wrote no image.tar"):
        cached_archive("k-3", lambda tmp: None, root=tmp_path)
    assert not (tmp_path / "k-3").exists()


def test_stale_temp_dir_of_a_killed_build_is_swept(tmp_path: Path) -> None:
    stale = tmp_path / ".tmp-k-4-999999"
    (stale / "work").mkdir(parents=True)
    (stale / "image.tar").write_bytes(b"half")
    other = tmp_path / ".tmp-k-40-1"  # another key's build: not ours to touch
    other.mkdir()

    def build(tmp: Path) -> None:
        (tmp / "image.tar").write_bytes(b"whole")

    archive = cached_archive("k-4", build, root=tmp_path)
    assert archive.read_bytes() == b"whole"
    assert not stale.exists()
    assert other.exists()


def _has_interpreter(elf: bytes) -> bool:
    """Whether a 64-bit little-endian ELF asks for a dynamic loader (a PT_INTERP header)."""
    assert elf[:4] == b"\x7fELF"
    (phoff,) = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    return any(struct.unpack_from("<I", elf, phoff + i * phentsize)[0] == 3 for i in range(phnum))


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_pause_image_runs_and_stops_on_sigterm(tmp_path: Path) -> None:
    image = ensure_pause_image(root=tmp_path)
    assert image.name == PAUSE_IMAGE
    with tarfile.open(image.oci_archive) as tar:
        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
        manifest = json.load(tar.extractfile(blob_path(index["manifests"][0]["digest"])))  # type: ignore[arg-type]
        config = json.load(tar.extractfile(blob_path(manifest["config"]["digest"])))  # type: ignore[arg-type]
        layer = tar.extractfile(blob_path(manifest["layers"][0]["digest"]))
        assert layer is not None
        with tarfile.open(fileobj=layer, mode="r:gz") as inner:
            assert inner.getnames() == ["pause"]
            inner.extract("pause", tmp_path / "out", filter="tar")
    assert config["config"]["Entrypoint"] == ["/pause"]
    pause = tmp_path / "out" / "pause"
    assert os.access(pause, os.X_OK)
    assert not _has_interpreter(pause.read_bytes())  # static: runs in an empty rootfs
    for sig in (signal.SIGTERM, signal.SIGINT):
        proc = subprocess.Popen([str(pause)])
        try:
            time.sleep(0.2)
            assert proc.poll() is None  # it waits
            proc.send_signal(sig)
            assert proc.wait(timeout=5) == 0
        finally:
            proc.kill()
            proc.wait()
    # a second call finds the cached archive
    assert ensure_pause_image(root=tmp_path) == image


def test_nymph_image_context_and_key_follow_the_sources(tmp_path: Path) -> None:
    from nymph.localcluster.imagebuild import CONTEXT_FILES, context_digest, context_files

    for rel in CONTEXT_FILES:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(rel)
    (tmp_path / "nymph" / "__pycache__").mkdir(parents=True)
    (tmp_path / "nymph" / "a.py").write_text("A = 1\n")
    (tmp_path / "nymph" / "queue").mkdir()
    (tmp_path / "nymph" / "queue" / "openapi.yaml").write_text("x: 1\n")
    (tmp_path / "nymph" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "t.py").write_text("")
    files = context_files(tmp_path)
    assert [f.as_posix() for f in files] == [*CONTEXT_FILES, "nymph/a.py", "nymph/queue/openapi.yaml"]
    before = context_digest(tmp_path, files)
    (tmp_path / "tests" / "t.py").write_text("changed")  # not in the image
    (tmp_path / "nymph" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\1")
    assert context_digest(tmp_path, files) == before
    (tmp_path / "nymph" / "a.py").write_text("A = 2\n")
    assert context_digest(tmp_path, files) != before
    (tmp_path / "nymph" / "a.py").write_text("A = 1\n")
    (tmp_path / "daemonset" / "Dockerfile").write_text("FROM other\n")
    assert context_digest(tmp_path, files) != before


def test_prune_keeps_the_most_recent(tmp_path: Path) -> None:
    for i, name in enumerate(["nymph-dev-a", "nymph-dev-b", "nymph-dev-c", "python-3-x"]):
        (tmp_path / name).mkdir()
        os.utime(tmp_path / name, (1000 + i, 1000 + i))
    removed = prune("nymph-dev", keep=2, root=tmp_path)
    assert removed == [tmp_path / "nymph-dev-a"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nymph-dev-b", "nymph-dev-c", "python-3-x"]


def _images(root: Path, count: int) -> list[Path]:
    made = []
    for i in range(count):
        p = root / f"nymph-dev-{i:02d}"
        (p / "sub").mkdir(parents=True)
        (p / "image.tar").write_bytes(b"x")
        os.utime(p, (1000 + i, 1000 + i))
        made.append(p)
    return made


def test_prune_skips_an_image_another_process_took_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two builds that end together both prune: an old image the other one renamed away first
    is left to it (no error), and the rest are still removed."""
    made = _images(tmp_path, 4)
    real = os.rename
    taken = tmp_path / ".pruned-by-another"

    def rename(src: Path, dst: Path) -> None:
        if Path(src) == made[1]:
            real(src, taken)  # the other process won this one
        real(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    removed = prune("nymph-dev", keep=1, root=tmp_path)
    assert removed == [made[2], made[0]]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".pruned-by-another", "nymph-dev-03"]


def test_concurrent_prunes_remove_each_old_image_once_and_never_fail(tmp_path: Path) -> None:
    made = _images(tmp_path, 30)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: prune("nymph-dev", keep=3, root=tmp_path), range(4)))
    removed = [p for r in results for p in r]
    assert sorted(removed) == sorted(made[:27])  # each by one of them
    assert sorted(p.name for p in tmp_path.iterdir()) == [p.name for p in made[27:]]


def test_prune_clears_what_a_killed_prune_left(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    left = tmp_path / f".pruned-nymph-dev-old-{dead.pid}"
    (left / "sub").mkdir(parents=True)
    mine = tmp_path / f".pruned-nymph-dev-busy-{os.getpid()}"  # a prune under way: left to it
    mine.mkdir()
    prune("nymph-dev", keep=3, root=tmp_path)
    assert not left.exists() and mine.exists()


def test_an_old_image_that_cannot_be_removed_is_said_and_the_build_stands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    made = _images(tmp_path, 3)

    def stuck(path: Path) -> None:
        raise ImageBuildError(f"cannot remove {path}: still mounted at {path}/proc")

    monkeypatch.setattr(images_module, "remove_tree", stuck)
    prune_after_build("nymph-dev", keep=1, root=tmp_path)  # no error: the new image is ready
    assert "old nymph-dev images not removed" in capsys.readouterr().err
    assert made[2].exists()
