"""The scheduling benchmark at its quick size, so `make bench` cannot rot: every section runs
against a real queue on each backend (PostgreSQL when its binaries are here) and the figures
merged into the results document have the keys and sane values (no targets)."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import pytest

from benchmarks import schedule_bench
from benchmarks.scoreboard import load_pages

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _latency(doc: Any, *keys: str) -> None:
    for k in keys:
        assert doc[k]["samples"] >= 1 and 0 < doc[k]["p50"] <= doc[k]["p95"] <= doc[k]["max"], (k, doc[k])
        assert all(math.isfinite(v) for v in doc[k].values())


def _backend(r: dict[str, Any], p: schedule_bench.Params) -> None:
    assert set(r["backlog"]) == {str(n) for n in p.sizes}
    for size, row in r["backlog"].items():
        assert row["queued"] == int(size) and row["seed_seconds"] >= 0
        assert p.min_samples <= row["claim_ms"]["samples"] <= p.samples
        assert p.min_samples <= row["post_ms"]["samples"] <= p.samples
        _latency(row, "claim_ms", "post_ms", "list_page_500_ms")
        assert " in team-a" in row["list_page_waiting_example"]  # a waiting reason was worked out
    assert r["claim_p50_ratio_100k_to_1k"] > 0 and r["post_p50_ratio_100k_to_1k"] > 0
    assert r["unrunnable_queued"] == p.starvation_backlog + 1
    _latency(r, "starvation_ms", "empty_claim_ms")
    assert r["starvation_ms"]["samples"] == p.starvation_samples
    assert set(r["share_10k_vs_10"]) == {"pods_keep_running", "pods_end_before_next_claim"}
    for row in r["share_10k_vs_10"].values():
        assert (row["big_queued"], row["small_queued"]) == (p.share_big, p.share_small)
        if row["small_started_ms"] is None:  # still waiting when the loop gave up
            assert row["small_started"] < p.share_small and row["claims"] == p.share_claim_cap
        else:
            assert p.share_small <= row["claims_until_small_done"] <= row["claims"]
            assert 0 < row["small_started_ms"]["p50"] <= row["small_started_ms"]["max"]
        assert 0 < row["big_first_started_ms"]["p50"] <= row["big_first_started_ms"]["max"]
    # With Pods left running, the small team's launches are served in turn with the big one's.
    assert r["share_10k_vs_10"]["pods_keep_running"]["claims_until_small_done"] <= 2 * p.share_small


def test_quick_run_merges_a_scheduling_section(tmp_path: Path) -> None:
    p = schedule_bench.QUICK
    figures = asyncio.run(schedule_bench.run(["sqlite", "postgresql"], p))
    out = tmp_path / "bench-results.json"
    out.write_text(json.dumps({"raw": {"kept": True}, "scheduling": {"other": 1}}))
    doc = json.loads(json.dumps(schedule_bench.merge(out, figures, p)))  # plain JSON
    assert doc["raw"] == {"kept": True}  # the file's other keys stay
    section = doc["scheduling"]
    assert section["other"] == 1 and section["seconds"] > 0 and section["params"]["sizes"] == list(p.sizes)
    _backend(section["sqlite"], p)
    pg = section["postgresql"]
    if "skipped" not in pg:
        _backend(pg, p)
    assert "sqlite" in schedule_bench.table(figures)
    text = load_pages.scheduling(doc)
    assert "| sqlite | 100 |" in text and "| sqlite | 1,000 |" in text
