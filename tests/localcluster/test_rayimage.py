"""The Ray image recipe's own steps (the image itself runs a RayJob in
tests/dockyard/test_kuberay_realnode.py)."""

from __future__ import annotations

from pathlib import Path

from nymph.localcluster import rayimage


def test_console_scripts_move_to_bin_and_run_the_images_python(tmp_path: Path) -> None:
    """pip's ``--target`` scripts name the host's interpreter; in the image they must run
    /usr/bin/python3 from /usr/local/bin, executable, with their body unchanged."""
    site, bindir = tmp_path / "site", tmp_path / "bin"
    (site / "bin").mkdir(parents=True)
    (site / "bin" / "ray").write_text("#!/work/venv/bin/python3.11\nimport sys\nsys.exit(0)\n")
    (site / "bin" / "data.txt").write_text("not a script\n")
    rayimage._scripts_to_bin(site, bindir)
    assert (bindir / "ray").read_text() == "#!/usr/bin/python3\nimport sys\nsys.exit(0)\n"
    assert (bindir / "ray").stat().st_mode & 0o111
    assert (bindir / "data.txt").read_text() == "not a script\n"
    assert not (site / "bin").exists()


def test_strip_leaves_out_only_the_unused_libraries(tmp_path: Path) -> None:
    """rllib, tune, train, serve, data, llm and the jars go; the core, the dashboard and the
    job submission client stay."""
    kept = ("_private", "dashboard", "job_submission", "util")
    for name in (*rayimage.STRIPPED, *kept):
        (tmp_path / "ray" / name).mkdir(parents=True)
        (tmp_path / "ray" / name / "x.py").write_bytes(b"x" * 10)
    assert rayimage.strip_ray(tmp_path) == 10 * len(rayimage.STRIPPED)
    assert sorted(p.name for p in (tmp_path / "ray").iterdir()) == sorted(kept)


def test_the_recipe_pins_ray_and_every_wheel() -> None:
    """Every wheel is pinned (a new version is a new cache key, never a silent upgrade) and the
    image's name carries the Ray version."""
    assert all("==" in w for w in rayimage.WHEELS)
    assert f"ray=={rayimage.RAY_VERSION}" in rayimage.WHEELS
    assert rayimage.RAY_IMAGE.endswith(f":{rayimage.RAY_VERSION}")
    assert "RAY_USAGE_STATS_ENABLED=0" in rayimage.ENV  # a head never reports to the Ray project
