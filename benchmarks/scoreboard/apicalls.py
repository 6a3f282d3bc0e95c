"""What the API server was asked during a run: its ``apiserver_request_total`` counter, by verb
and resource, read from its ``/metrics`` before and after (the local cluster's admin
credentials), so a path's API server CPU per launch can be told apart: creates, status
updates, reads, log requests, watches."""

from __future__ import annotations

import collections
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from nymph.localcluster import LocalCluster

Counts = collections.Counter[str]


def parse_request_counts(text: str) -> Counts:
    """``apiserver_request_total`` of a ``/metrics`` page, summed by ``"VERB resource[/sub]"``
    (over codes, groups, versions and scopes)."""
    counts: Counts = collections.Counter()
    for family in text_string_to_metric_families(text):
        if family.name != "apiserver_request":
            continue
        for sample in family.samples:
            if sample.name != "apiserver_request_total":
                continue
            labels = sample.labels
            resource, sub = labels.get("resource", ""), labels.get("subresource", "")
            if not resource:  # a path that is no resource (its path is in ``subresource``)
                resource = sub or "(none)"
            elif sub:
                resource += "/" + sub
            counts[f"{labels.get('verb', '?')} {resource}"] += int(sample.value)
    return counts


def request_counts(kube: LocalCluster) -> Counts:
    req = urllib.request.Request(kube.server + "/metrics", headers={"Accept": "text/plain"})
    with urllib.request.urlopen(req, timeout=30, context=kube.ssl_context()) as resp:
        return parse_request_counts(resp.read().decode())


def per_launch(before: Counts, after: Counts, launches: int, *, floor: float = 0.01) -> dict[str, float]:
    """Requests per launch between two readings, most first (those under ``floor`` left out)."""
    out = {k: round((after[k] - before[k]) / launches, 2) for k in after}
    return dict(sorted(((k, v) for k, v in out.items() if v >= floor), key=lambda kv: (-kv[1], kv[0])))
