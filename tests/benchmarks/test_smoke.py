"""The benchmark scoreboard at tiny N, so `make bench` cannot rot: every section runs against
the real API server and the JSON it writes has the keys and sane values (no targets)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from benchmarks import daemon_bench
from benchmarks.scoreboard import report
from benchmarks.scoreboard.nymph_run import namespace_of
from nymph.localcluster import LocalCluster

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(240)]

CONFIGS = {"direct", "kubectl_batched", "kubectl_single", "api"}


def _numbers(doc: Any) -> list[float]:
    if isinstance(doc, bool):
        return []
    if isinstance(doc, (int, float)):
        return [float(doc)]
    if isinstance(doc, dict):
        return [x for v in doc.values() for x in _numbers(v)]
    if isinstance(doc, list):
        return [x for v in doc for x in _numbers(v)]
    return []


async def test_smoke_run_writes_every_section(kube: LocalCluster, tmp_path: Path) -> None:
    params, _ = daemon_bench.parse(["--smoke"])
    results = await daemon_bench.run(kube, tmp_path, params)
    doc = json.loads(json.dumps(results))  # what is written is plain JSON

    assert all(math.isfinite(x) for x in _numbers(doc))
    assert doc["machine"]["cpus"] >= 1 and doc["machine"]["kube_apiserver"].startswith("v")
    assert doc["raw"]["concurrent"]["per_s"] > 0 and doc["raw"]["serial"]["per_s"] > 0
    assert doc["raw"]["latency"]["create"]["p50_ms"] > 0
    assert set(doc["nymph"]) == CONFIGS
    # each path ran on a cluster without the Pods of the runs before it: their namespaces are gone
    assert set(doc["namespace_dropped_s"]) == {"raw", *CONFIGS}
    names = {ns["metadata"]["name"] for ns in kube.api("GET", "/api/v1/namespaces")["items"]}
    assert not names & {"bench-raw", *(namespace_of(c) for c in CONFIGS)}
    for name, res in doc["nymph"].items():
        assert set(res["throughput"]) == {"1", "3"}
        for n, t in res["throughput"].items():
            assert t["per_s"] > 0 and t["cpu_ms_per_launch"]["kube-apiserver"] >= 0
            # the daemon's apply calls in this run alone carried its launches; direct has none
            if name == "direct":
                assert "apply_calls" not in t
            else:
                assert 1 <= t["apply_calls"] <= int(n)
                assert t["manifests_per_apply"] * t["apply_calls"] == pytest.approx(int(n), abs=0.5)
        assert res["latency"]["post_returned_to_added"]["samples"] == params.latency_n
        assert (name == "direct") == ("daemon_rss_mb_after" not in res)
    # Every ratio is under a key ending in _ratio; the headline ones are there and positive.
    ratios = {k: v for k, v in doc.items() if k.endswith("_ratio")}
    assert {f"{c}_ratio" for c in CONFIGS} <= ratios.keys()
    assert all(v is not None and v > 0 for v in ratios.values())
    assert ratios == report.ratios(doc)
    kc = doc["kubectl_invocation"]
    assert kc["read_only_home"]["api_requests"] >= 1 and kc["cache_dir"]["wall"]["p50_ms"] > 0
    idle = doc["idle_daemon"]
    assert 0 < idle["rss_mb"] < 1024 and idle["cpu_pct_of_core"] >= 0
    assert set(doc["queue"]) == {"1", "3"} and all(q["claims_per_s"] > 0 for q in doc["queue"].values())
    assert doc["targets"] is None and doc["soak"] is None
    assert "raw concurrent" in report.table(doc)
    applies = [x for x in report.table(doc).splitlines() if "apply calls" in x]
    assert sorted(x.split()[0] for x in applies) == sorted(CONFIGS - {"direct"})
    assert "| the daemon's apply calls (n = largest) |" in report.markdown(doc)
    in_run = doc["cpu_per_launch_vs_apiserver_in_run"]
    assert set(in_run) == {"api", "direct", "kubectl_batched"}
    # /proc counts CPU in clock ticks (10 ms): nymph's CPU for 3 launches may be under one, so 0
    # is a measurement here, never None (the API server's CPU in the run is always counted).
    assert all(v is not None and v >= 0 for v in in_run.values())
