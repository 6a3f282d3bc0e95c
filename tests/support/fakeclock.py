"""A clock the test sets: pass it where code takes ``clock: Callable[[], float]``."""

from __future__ import annotations


class FakeClock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
