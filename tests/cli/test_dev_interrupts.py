"""How ``nymph dev`` takes Ctrl-C and SIGTERM while it starts up, stays and stops."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

import pytest

from nymph.cli.devenv import Interrupts, step


@pytest.fixture
def signals() -> Iterator[Interrupts]:
    s = Interrupts()
    try:
        yield s
    finally:
        s.restore()


def _signal_swallowed_where_it_lands() -> None:
    """What a fork handler of the logging module does with the interrupt it is handed."""
    with contextlib.suppress(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)


def test_an_interrupt_swallowed_where_it_landed_is_raised_again_at_the_next_step(
    signals: Interrupts, capsys: pytest.CaptureFixture[str]
) -> None:
    """Start-up does not run on after a Ctrl-C whose KeyboardInterrupt was swallowed: the next
    step raises it before printing its line."""
    _signal_swallowed_where_it_lands()
    assert signals.stop.is_set()
    with pytest.raises(KeyboardInterrupt):
        step(3, "starting the queue service", signals)
    assert "[3/" not in capsys.readouterr().err


def test_a_second_signal_after_the_interrupt_only_says_so(
    signals: Interrupts, capfd: pytest.CaptureFixture[str]
) -> None:
    """Once interrupted, while the code on its way out stops what it started, another Ctrl-C
    or SIGTERM raises nothing there and says to wait."""
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGTERM)  # raises here if it would cut the stop short
    signals.stopping()
    os.kill(os.getpid(), signal.SIGINT)
    signals.check()  # stopping: nothing to raise
    assert capfd.readouterr().err.count("still stopping what it started") == 2


def test_a_signal_inside_held_interrupts_at_the_end_of_the_block(signals: Interrupts) -> None:
    """A child being started and recorded is not cut off by Ctrl-C: the interrupt waits for the
    block's end, where it is raised."""
    reached_end = False
    with pytest.raises(KeyboardInterrupt), signals.held():
        os.kill(os.getpid(), signal.SIGINT)
        signals.check()  # held: not here either
        reached_end = True
    assert reached_end


def test_no_interrupt_means_check_and_steps_go_on(
    signals: Interrupts, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without a signal, a step prints its line and raises nothing."""
    signals.check()
    step(4, "starting the daemon", signals)
    assert "[4/7] starting the daemon" in capsys.readouterr().err
    assert not signals.stop.is_set()


def test_a_signal_while_staying_ends_the_stay_without_raising(signals: Interrupts) -> None:
    """During --stay a signal only sets the stop event the stay waits on."""
    signals.staying()
    os.kill(os.getpid(), signal.SIGINT)
    assert signals.stop.is_set()
    signals.check()


def test_a_swallowed_interrupt_keeps_a_held_block_from_starting(signals: Interrupts) -> None:
    """After a Ctrl-C that was swallowed, the next child is not started (and then stopped): the
    interrupt is raised as the held block begins."""
    _signal_swallowed_where_it_lands()
    started = False
    with pytest.raises(KeyboardInterrupt), signals.held():
        started = True
    assert not started
