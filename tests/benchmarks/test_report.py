"""The scoreboard's CPU comparisons: nymph's own processes (queue, daemon, kubectl) against the
API server, per dispatch path at the largest N."""

from __future__ import annotations

from typing import Any

from benchmarks.scoreboard import report


def _doc() -> dict[str, Any]:
    def run(**cpu: float) -> dict[str, Any]:
        return {
            "throughput": {"1": {"cpu_ms_per_launch": {"queue": 99.0}}, "1000": {"cpu_ms_per_launch": cpu}}
        }

    return {
        "raw": {"concurrent": {"cpu_ms_per_launch": {"kube-apiserver": 2.5, "etcd": 1.0}}},
        "nymph": {
            "api": run(queue=2.0, daemon=3.0, **{"kube-apiserver": 10.0, "etcd": 4.0}),
            "direct": run(queue=6.0, **{"kube-apiserver": 0.0}),
            "kubectl_batched": run(queue=1.0, daemon=2.0, kubectl=3.0, **{"kube-apiserver": 12.0}),
            "kubectl_single": run(queue=1.0, kubectl=50.0, **{"kube-apiserver": 10.0}),
        },
    }


def test_against_the_raw_create_run_the_largest_n_counts_and_only_nymphs_own_processes() -> None:
    assert report.cpu_vs_apiserver(_doc()) == {"api": 2.0, "direct": 2.4, "kubectl_batched": 2.4}


def test_measured_together_each_path_is_divided_by_the_api_servers_cpu_in_its_own_run() -> None:
    # direct's run shows no API server CPU: no ratio rather than a division by zero
    assert report.cpu_vs_apiserver_in_run(_doc()) == {"api": 0.5, "direct": None, "kubectl_batched": 0.5}
