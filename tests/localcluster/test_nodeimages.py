"""The node seed store: one seed per image set, shared by concurrent runs without deleting the
seed another run is using."""

from __future__ import annotations

from pathlib import Path

import pytest

from nymph.localcluster import nodeimages


@pytest.fixture
def seeds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("NYMPH_CACHE_DIR", str(tmp_path))
    return nodeimages.seeds_dir()


def test_a_seed_in_use_survives_another_image_set(seeds: Path) -> None:
    """While one run copies its seed, a run with another image set that prunes everything
    (keep=0) leaves that seed alone; once released, the next prune removes it."""
    built: list[str] = []

    def build_a(tmp: Path) -> None:
        built.append("a")
        (tmp / "containerd-root").mkdir()

    with nodeimages.seed_root("aaaa", build_a) as seed_a:
        with nodeimages.seed_root("bbbb", lambda t: (t / "containerd-root").mkdir(), keep=0) as seed_b:
            assert seed_b.is_dir()
        assert seed_a.is_dir(), "a seed held by another run was deleted"
    with nodeimages.seed_root("bbbb", lambda t: (t / "containerd-root").mkdir(), keep=0):
        pass
    assert not (seeds / "aaaa").exists()
    assert (seeds / "bbbb" / "containerd-root").is_dir()
    assert built == ["a"]


def test_a_seed_is_built_once_and_recent_ones_are_kept(seeds: Path) -> None:
    """A second use of a key reuses its seed; seeds of other sets within ``keep`` stay."""
    calls: list[str] = []

    def build(tmp: Path) -> None:
        calls.append(tmp.name)
        (tmp / "containerd-root").mkdir()

    for key in ("k1", "k2", "k1"):
        with nodeimages.seed_root(key, build, keep=1) as seed:
            assert seed == seeds / key / "containerd-root"
    assert len(calls) == 2
    assert sorted(p.name for p in seeds.iterdir() if not p.name.startswith(".")) == ["k1", "k2"]
    assert not list(seeds.glob(".tmp-*"))


def test_a_failed_build_leaves_no_seed(seeds: Path) -> None:
    """A build that raises publishes nothing and leaves no scratch directory behind."""

    def broken(tmp: Path) -> None:
        (tmp / "containerd-root").mkdir()
        raise OSError("import failed")

    with pytest.raises(OSError, match="import failed"), nodeimages.seed_root("cccc", broken):
        pass
    assert not (seeds / "cccc").exists()
    assert not list(seeds.glob(".tmp-*"))
