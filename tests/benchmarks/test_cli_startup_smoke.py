"""The CLI start-up benchmark, so `make bench` cannot rot: a short run against the real queue it
starts writes its ratios into the results document under ``cli_startup_ratio`` and keeps the
document's other keys."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import cli_startup


def test_a_short_run_merges_its_ratios_and_keeps_the_other_keys(tmp_path: Path) -> None:
    out = tmp_path / "bench-results.json"
    out.write_text(json.dumps({"scheduling": {"kept": True}, "cli_startup_ratio": {"old": 1}}))
    assert cli_startup.main(["--repeat", "1", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["scheduling"] == {"kept": True}
    section = doc["cli_startup_ratio"]
    assert "old" not in section and section["repeat"] == 1
    for name in ("--help", "instances --help", "launch --help", "instances", "launch"):
        assert section[name] > 0 and section["median_ms"][name] > 0
    assert section["median_ms"]["python -c pass"] > 0


def test_ratios_divide_by_the_bare_interpreter() -> None:
    medians = {"python -c pass": 0.02, "--help": 0.1, "launch --help": 0.05}
    assert cli_startup.ratios(medians) == {"--help": 5.0, "launch --help": 2.5}
