"""Prometheus metrics of one queue replica (own registry, so tests can run several queues):
``GET /metrics``, admin token.

- ``nymph_queue_launch_claim_seconds``: from a launch's POST (its task written) to the claim
  answer that hands it to a daemon, first attempts only, measured inside this replica so a
  daemon's or a load generator's own delays do not count;
- ``nymph_queue_claims_waiting``: claims held in a long-poll right now (in line for work);
- ``nymph_queue_launch_batch_launches``: the launches each launch batch wrote (PostgreSQL:
  launch POSTs that arrive together are written together, :mod:`nymph.queue.launchbatch`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Gauge, Histogram

#: Seconds: fine below 100 ms (a claim woken at once), coarse up to a minute (a backlog).
CLAIM_BUCKETS = (
    0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2,
    0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip


#: Launches per batch (at most :data:`nymph.queue.launchbatch.MAX_BATCH`).
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


@dataclass
class QueueMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.launch_claim_seconds = Histogram(
            "nymph_queue_launch_claim_seconds",
            "From a launch's POST to the claim answer carrying it (first attempts, this replica)",
            buckets=CLAIM_BUCKETS,
            registry=self.registry,
        )
        self.claims_waiting = Gauge(
            "nymph_queue_claims_waiting",
            "Claims held in a long-poll, in line for work",
            registry=self.registry,
        )

        self.launch_batch_launches = Histogram(
            "nymph_queue_launch_batch_launches",
            "Launches written by each launch batch (POSTs that arrived together, this replica)",
            buckets=BATCH_BUCKETS,
            registry=self.registry,
        )

    def batch_written(self, launches: int) -> None:
        self.launch_batch_launches.observe(launches)

    def watch_waiting(self, count: Callable[[], int]) -> None:
        """Read the number of waiting claims from ``count`` at each scrape."""
        self.claims_waiting.set_function(lambda: float(count()))

    def claimed(self, waited: Iterable[float]) -> None:
        for seconds in waited:
            self.launch_claim_seconds.observe(max(0.0, seconds))
