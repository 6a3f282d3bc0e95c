"""The benchmark's count of API server requests per launch, from the server's /metrics text."""

from __future__ import annotations

import collections

from benchmarks.scoreboard.apicalls import parse_request_counts, per_launch

PAGE = """\
# HELP apiserver_request_total [STABLE] Counter of apiserver requests broken out for each verb...
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1"} 1200
apiserver_request_total{code="409",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="status",verb="PATCH",version="v1"} 2400
apiserver_request_total{code="400",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="log",verb="GET",version="v1"} 7
apiserver_request_total{code="200",component="",dry_run="",group="",resource="",scope="",subresource="/readyz",verb="GET",version=""} 2
# HELP apiserver_request_duration_seconds [STABLE] Response latency distribution...
# TYPE apiserver_request_duration_seconds histogram
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1",le="0.005"} 900
"""


def test_requests_are_summed_by_verb_and_resource_over_codes_and_other_metrics_ignored() -> None:
    counts = parse_request_counts(PAGE)
    assert counts == {
        "POST pods": 1203,
        "PATCH pods/status": 2400,
        "GET pods/log": 7,
        "GET /readyz": 2,
    }


def test_per_launch_counts_only_what_the_run_added_most_first_and_drops_the_rare() -> None:
    before = collections.Counter({"POST pods": 200, "PATCH pods/status": 400, "GET pods/log": 7})
    after = collections.Counter(
        {"POST pods": 1200, "PATCH pods/status": 2400, "GET pods/log": 8, "LIST nodes": 1}
    )
    got = per_launch(before, after, 1000, floor=0.01)
    assert list(got.items()) == [("PATCH pods/status", 2.0), ("POST pods", 1.0)]
    assert per_launch(before, after, 100) == {
        "PATCH pods/status": 20.0,
        "POST pods": 10.0,
        "GET pods/log": 0.01,
        "LIST nodes": 0.01,
    }
