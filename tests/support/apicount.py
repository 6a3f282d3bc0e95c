"""What the local API server was asked, from its ``apiserver_request_total`` counter."""

from __future__ import annotations

from benchmarks.scoreboard import apicalls
from nymph.localcluster import LocalCluster


def log_requests(kube: LocalCluster) -> int:
    """How many requests for a Pod's log the API server has answered."""
    return sum(n for key, n in apicalls.request_counts(kube).items() if key.endswith(" pods/log"))
