"""Prometheus metrics of one daemon (own registry, so tests can run several daemons)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.claims = Counter("nymph_claims_total", "Claim calls made to the queue", ["result"], registry=r)
        self.tasks = Counter("nymph_tasks_claimed_total", "Tasks claimed, by kind", ["kind"], registry=r)
        self.launches = Counter("nymph_launches_total", "Launches handled, by result", ["result"], registry=r)
        self.stops = Counter("nymph_stops_total", "Stop tasks handled, by result", ["result"], registry=r)
        self.apply_seconds = Histogram(
            "nymph_apply_seconds",
            "Latency of one apply invocation (a batch)",
            ["applier"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
            registry=r,
        )
        self.apply_batch = Histogram(
            "nymph_apply_batch_size",
            "Manifests per apply invocation",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128),
            registry=r,
        )
        self.queue_seconds = Histogram(
            "nymph_queue_roundtrip_seconds",
            "Round-trip time of queue calls (claims exclude the long-poll hold)",
            ["call"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5),
            registry=r,
        )
        self.watch_restarts = Counter(
            "nymph_watch_restarts_total", "Pod watch restarts", ["namespace", "reason"], registry=r
        )
        self.reports_buffered = Gauge(
            "nymph_reports_buffered", "Reports and completions not yet acknowledged", registry=r
        )
        self.inflight = Gauge("nymph_inflight_tasks", "Claimed tasks not yet finished", registry=r)
        self.tasks_refused = Counter(
            "nymph_tasks_refused_total", "Tasks refused because a field did not check out", registry=r
        )
        self.reaped = Counter("nymph_reaped_total", "Finished Pods and workdirs reaped", ["what"], registry=r)
