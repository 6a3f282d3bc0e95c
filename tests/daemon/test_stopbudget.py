"""The time a stopping daemon gives each step: in-flight work gets --grace from the start, and
the whole stop ends within --grace and the reserve, however slowly the queue answers."""

from __future__ import annotations

from nymph.daemon.stopbudget import CALL_SECONDS, StopBudget
from tests.support.fakeclock import FakeClock


def test_a_stop_whose_every_call_times_out_still_ends_within_grace_and_the_reserve() -> None:
    clock = FakeClock(100.0)
    budget = StopBudget(grace=20.0, reserve=8.0, clock=clock)
    clock.now += budget.left()  # the unstarted leases: the queue does not answer
    drain = budget.drain()
    assert drain == 20.0 - CALL_SECONDS, "in-flight work gets what is left of --grace"
    clock.now += drain + 5.0  # the drain, then the wait for the work it cancelled
    for cap in (CALL_SECONDS, 10.0, CALL_SECONDS):  # the other leases, the flush, release all
        clock.now += budget.left(cap=cap)  # each one times out
    assert clock.now - 100.0 == 20.0 + 8.0, "the steps' own caps add up to 41 s; the budget ends at 28"
    assert budget.left() == 0.0 and budget.drain() == 0.0


def test_a_quick_stop_gives_every_step_its_full_cap() -> None:
    clock = FakeClock(100.0)
    budget = StopBudget(grace=20.0, reserve=8.0, clock=clock)
    assert budget.left() == CALL_SECONDS and budget.left(cap=10.0) == 10.0
    assert budget.drain() == 20.0
    clock.now += 1.0
    assert budget.left(cap=10.0) == 10.0, "the reserve is untouched by the steps before the drain"
