"""The time a stopping daemon has: ``--grace`` for in-flight work plus a reserve for the calls to
the queue around it, so the whole stop fits in the Pod's grace period (the chart gives the
daemon's Pod ``--grace`` + 10 s before its SIGKILL)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

#: What a stop may take beyond ``--grace`` (seconds): the hand-backs of leases, the flush of the
#: outbox, and the wait for cancelled work, below the 10 s the chart adds
RESERVE_SECONDS = 8.0
#: The longest a stopping daemon waits for any one answer of the queue (seconds)
CALL_SECONDS = 3.0


@dataclass
class StopBudget:
    grace: float
    reserve: float = RESERVE_SECONDS
    clock: Callable[[], float] = time.monotonic
    started: float = field(init=False)

    def __post_init__(self) -> None:
        self.started = self.clock()

    def left(self, cap: float = CALL_SECONDS) -> float:
        """Seconds the next step may take: at most ``cap``, and never past the budget's end."""
        end = self.started + self.grace + self.reserve
        return max(0.0, min(cap, end - self.clock()))

    def drain(self) -> float:
        """Seconds in-flight work may still run: ``grace`` from the start, less what the steps
        before took (the reserve stays for the steps after)."""
        return max(0.0, self.started + self.grace - self.clock())
