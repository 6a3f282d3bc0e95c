"""A Pod watch's cache as the daemon's tracker reads it (:class:`nymph.daemon.tracker.PodCache`),
filled by hand: the Pods a test says the watch has seen, and whether the watch is connected."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class WatchCache:
    namespace: str = "jobs"
    cache: dict[str, dict[str, Any]] = field(default_factory=dict)
    connected: bool = True
