"""``nymph dev`` without --state-dir starts each run in a fresh state directory (so a demo never
lists an earlier run's instances), keeps only the newest few earlier ones, and names the latest
as ``current``."""

from __future__ import annotations

from pathlib import Path

from nymph.cli.devenv import fresh_state


def test_each_run_gets_a_fresh_state_and_old_ones_are_pruned(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    for i in range(7):
        old = runs / f"20260101-00000{i}-1"
        old.mkdir()
        (old / "queue.db").write_text("earlier run")
    state = fresh_state(tmp_path, keep=3)
    assert state.parent == runs and state.is_dir() and list(state.iterdir()) == []
    assert (tmp_path / "current").resolve() == state.resolve()
    left = sorted(p.name for p in runs.iterdir())
    assert left == ["20260101-000004-1", "20260101-000005-1", "20260101-000006-1", state.name]
