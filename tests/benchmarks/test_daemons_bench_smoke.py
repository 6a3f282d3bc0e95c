"""The many-daemons benchmark, so `make bench` cannot rot: a short run of two daemon counts
against the real queues it starts (up together, each round's streams at the same time) claims every launch
it POSTs to each (counted by each queue's own histogram), writes its section and keeps the
document's other keys; the quantile of a cumulative histogram interpolates within its bucket."""

from __future__ import annotations

import json
import math
import signal
import statistics
from pathlib import Path

import pytest

from benchmarks import daemons_bench
from benchmarks.scoreboard import load_pages


def test_a_short_run_claims_every_launch_and_merges_its_section(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench-results.json"
    out.write_text(json.dumps({"scheduling": {"kept": True}}))
    argv = [
        *("--counts", "1,3", "--rate", "10", "--seconds", "2", "--rounds", "2"),
        *("--idle-seconds", "0.5", "--backlog", "10", "--backlog-seconds", "0.5", "--out", str(out)),
    ]
    before = signal.getsignal(signal.SIGTERM)
    assert daemons_bench.main(argv) == 0
    # main() leaves the test process's SIGTERM as it was (only the script's own run sets it)
    assert signal.getsignal(signal.SIGTERM) == before
    said = [line.split(",")[0].strip() for line in capsys.readouterr().out.splitlines() if "round " in line]
    assert said == ["round 1: 1 daemons", "round 1: 3 daemons", "round 2: 1 daemons", "round 2: 3 daemons"]
    doc = json.loads(out.read_text())
    assert doc["scheduling"] == {"kept": True}
    section = doc["daemons_1000"]
    assert set(section["runs"]) == {"1", "3"}
    assert section["backlog_launches"] == 10
    for row in section["runs"].values():
        # 20 a round; the 10 launches no node fits, POSTed after the rounds, are never claimed
        assert row["claimed"] == row["launches"] == 40
        assert row["backlog_cpu_ms_per_launch"] > 0 and row["backlog_cpu_pct"] >= 0
        rounds = row["cpu_ms_per_launch_rounds"]
        assert len(rounds) == 2 and all(c > 0 for c in rounds)
        assert min(rounds) <= row["cpu_ms_per_launch"] <= max(rounds)  # their median
        assert row["parked"] == row["daemons"]
        assert 0 < row["p50_ms"] <= row["p95_ms"]
    assert section["p95_ms"] == section["runs"]["3"]["p95_ms"]
    one, three = section["runs"]["1"], section["runs"]["3"]
    assert section["p95_ratio"] == round(three["p95_ms"] / one["p95_ms"], 2)
    assert section["cpu_ms_per_launch_ratio_of_medians"] == round(
        three["cpu_ms_per_launch"] / one["cpu_ms_per_launch"], 2
    )
    paired = [
        t / o for t, o in zip(three["cpu_ms_per_launch_rounds"], one["cpu_ms_per_launch_rounds"], strict=True)
    ]
    assert section["cpu_ms_per_launch_round_ratios"] == [round(p, 4) for p in paired]
    assert section["cpu_ms_per_launch_ratio"] == round(statistics.median(paired), 2)
    assert section["rounds"] == 2
    assert section["counts_together"] is True and section["counts_take_turns"] is False


def test_the_cpu_ratio_is_the_median_of_the_ratios_of_each_rounds_streams() -> None:
    """A slow spell that falls on one round moves both counts' streams of that round: the ratio
    is taken round by round and their median kept, not the ratio of two medians whose rounds
    met different paces of the machine."""
    row = {"p50_ms": 2.0, "p95_ms": 3.0, "idle_cpu_pct": 0.1}
    one = {**row, "cpu_ms_per_launch": 5.0, "cpu_ms_per_launch_rounds": [4.0, 5.0, 6.5, 7.0, 4.5]}
    top = {**row, "cpu_ms_per_launch": 6.3, "cpu_ms_per_launch_rounds": [4.4, 5.5, 7.15, 7.7, 6.3]}
    section = daemons_bench.summarize({1: one, 1000: top}, rate=40, seconds=15)
    assert section["cpu_ms_per_launch_round_ratios"] == [1.1, 1.1, 1.1, 1.1, 1.4]
    assert section["cpu_ms_per_launch_ratio"] == 1.1
    assert section["cpu_ms_per_launch_ratio_of_medians"] == 1.26
    uneven = daemons_bench.summarize(
        {1: {**one, "cpu_ms_per_launch_rounds": [4.0, 5.0]}, 1000: top}, rate=40, seconds=15
    )
    assert uneven["cpu_ms_per_launch_round_ratios"] == []
    assert uneven["cpu_ms_per_launch_ratio"] == uneven["cpu_ms_per_launch_ratio_of_medians"] == 1.26


def test_quantiles_interpolate_within_their_bucket() -> None:
    buckets = [(0.01, 0.0), (0.02, 50.0), (0.05, 100.0), (math.inf, 100.0)]
    assert daemons_bench.quantile(buckets, 0.5) == 0.02
    assert abs((daemons_bench.quantile(buckets, 0.25) or 0) - 0.015) < 1e-12
    assert daemons_bench.quantile([(math.inf, 0.0)], 0.5) is None


def test_the_page_pairs_each_round_of_the_largest_count_with_one_daemons() -> None:
    """The performance page gives the ratio round by round (the streams of one round met the
    same pace of the machine), and only for a run whose counts ran their rounds together or took
    turns, with equal rounds."""
    runs = {
        "1": {"p50_ms": 2, "p95_ms": 3, "idle_cpu_pct": 0.1, "cpu_ms_per_launch": 4.0,
              "cpu_ms_per_launch_rounds": [4.0, 5.0, 3.0]},
        "100": {"p50_ms": 2, "p95_ms": 3, "idle_cpu_pct": 0.5, "cpu_ms_per_launch": 9.0,
                "cpu_ms_per_launch_rounds": [9.0, 9.0, 9.0]},
        "1000": {"p50_ms": 2, "p95_ms": 3, "idle_cpu_pct": 2.0, "cpu_ms_per_launch": 5.0,
                 "cpu_ms_per_launch_rounds": [5.0, 5.5, 3.3]},
    }  # fmt: skip
    section = {"runs": runs, "rounds": 3, "counts_take_turns": True}
    assert load_pages.round_ratios(section) == [1.25, 1.1, 1.1]
    page = " ".join(load_pages.daemons({"daemons_1000": section}).split())  # unwrapped
    assert "1,000 daemons' CPU per launch over one daemon's: 1.25, 1.10, 1.10." in page
    both = {**section, "cpu_ms_per_launch_ratio": 1.1, "cpu_ms_per_launch_ratio_of_medians": 1.25}
    page = " ".join(load_pages.daemons({"daemons_1000": both}).split())
    assert "CPU per launch ratio 1.1 (the median of the rounds' ratios below) (target <= 1.2)" in page
    assert "the ratio of the two counts' medians is 1.25." in page
    assert load_pages.round_ratios({**section, "counts_take_turns": False}) == []
    together = {**section, "counts_take_turns": False, "counts_together": True}
    assert load_pages.round_ratios(together) == [1.25, 1.1, 1.1]
    assert "each pair from one round)" in " ".join(load_pages.daemons({"daemons_1000": together}).split())
    uneven = {**runs, "1": {**runs["1"], "cpu_ms_per_launch_rounds": [4.0, 5.0]}}
    assert load_pages.round_ratios({**section, "runs": uneven}) == []
    assert "Round by round" not in load_pages.daemons({"daemons_1000": {**section, "runs": uneven}})
