"""The paced raw-create benchmark, so it cannot rot: against the real API server, a paced run
is held to its pace while the burst is not, and every figure it reports is there."""

from __future__ import annotations

import math

import pytest

from benchmarks import raw_paced
from nymph.localcluster import LocalCluster

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(240)]


async def test_a_paced_run_keeps_to_its_pace_and_the_burst_does_not(kube: LocalCluster) -> None:
    ns = "bench-paced-smoke"
    try:
        doc = await raw_paced.measure(
            kube, n=8, rates=[10.0], concurrency=4, settle_seconds=2.0, namespace=ns
        )
        burst, paced = doc["burst"], doc["paced"]["10"]
        # Eight creates at 10/s start over 0.7 s: no faster than the pace (and a little slower,
        # with the last ADDED after them); the burst runs as fast as the server answers.
        assert paced["per_s"] <= 10 * 8 / 7 + 0.01
        assert burst["per_s"] > 2 * paced["per_s"]
        for r in (burst, paced):
            assert set(r) == {
                "per_s",
                "apiserver_cpu_ms_per_create",
                "apiserver_cores",
                "apiserver_cpu_ms_per_pod_life",
            }
            assert all(isinstance(v, float | int) and math.isfinite(v) and v >= 0 for v in r.values())
            assert r["apiserver_cpu_ms_per_pod_life"] >= r["apiserver_cpu_ms_per_create"]
        assert "10/s" in raw_paced.table(doc)
    finally:
        kube.api("DELETE", f"/api/v1/namespaces/{ns}")


def test_bad_paces_are_refused_with_what_to_send(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--rates", "fast"], ["--rates", "0"], ["--n", "0"]):
        with pytest.raises(SystemExit) as exc:
            raw_paced.main(argv)
        assert exc.value.code == 2
        assert "--rates" in capsys.readouterr().err
