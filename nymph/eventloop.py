"""The event loop of nymph's long-running processes: the queue and the daemon.

Both spend much of their CPU in the event loop itself (its selector, callbacks, transports):
every claim, report, Pod create and watch event passes through it. uvloop (libuv under
asyncio's interface) runs the same program in less of it, so it is the default wherever it is
installed (it is a dependency on Linux and macOS). ``NYMPH_EVENT_LOOP`` chooses:

- ``auto`` (the default, also when unset or empty): uvloop if it imports, else asyncio's own;
- ``uvloop``: uvloop, or an error that says how to install it;
- ``asyncio``: the standard library's loop (to compare, or to rule uvloop out of a problem).

The short-lived commands keep ``asyncio.run``: their start-up matters more than their loop.

:func:`run` also sets the cyclic garbage collector for a long run (:func:`tune_gc`): what
start-up made (modules, classes, settings) is frozen out of every later collection, and a young
collection waits for :data:`GC_YOUNG` new objects instead of 700. Each watch event and request
makes thousands of short-lived dicts and lists that reference counting frees at once; by
default they set off a young collection every few hundred, and a full one walks every object
start-up made, again and again.

This module imports asyncio only when a loop is made, so a parser can quote :data:`HELP`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from nymph.errors import ConfigError

if TYPE_CHECKING:
    import asyncio

T = TypeVar("T")

ENV = "NYMPH_EVENT_LOOP"
CHOICES = ("auto", "uvloop", "asyncio")
#: one sentence for the ``--help`` of the commands that run on it
HELP = (
    f"The event loop is uvloop where it is installed; {ENV}=asyncio runs on asyncio's own "
    "(auto, the default, falls back to it)."
)


def _uvloop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def loop_factory(choice: str | None = None) -> tuple[str, Callable[[], asyncio.AbstractEventLoop]]:
    """The loop ``choice`` (default: ``$NYMPH_EVENT_LOOP``) names: its name and its factory."""
    import asyncio

    raw = os.environ.get(ENV, "") if choice is None else choice
    wanted = raw.strip().lower() or "auto"
    if wanted not in CHOICES:
        raise ConfigError(f"{ENV}={raw!r} is not a loop nymph knows: use one of {', '.join(CHOICES)}")
    if wanted == "asyncio":
        return "asyncio", asyncio.new_event_loop
    uv = _uvloop_factory()
    if uv is not None:
        return "uvloop", uv
    if wanted == "uvloop":
        raise ConfigError(f"{ENV}=uvloop but uvloop is not installed: pip install uvloop, or unset {ENV}")
    return "asyncio", asyncio.new_event_loop


#: New objects (allocations less deallocations) that set off a young collection (Python: 700).
GC_YOUNG = 10_000


def tune_gc() -> None:
    """Freeze what exists now out of the collector's walks, and collect young objects less
    often (:data:`GC_YOUNG`); the older generations keep Python's ratios (10 and 10)."""
    import gc

    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG, older, oldest)


def run(main: Coroutine[Any, Any, T], *, choice: str | None = None) -> T:
    """``asyncio.run(main)`` on the loop :func:`loop_factory` picks (same shutdown: pending tasks
    cancelled, async generators and the default executor closed), with :func:`tune_gc`."""
    import asyncio

    try:
        _, factory = loop_factory(choice)
    except BaseException:
        main.close()  # never awaited: say nothing of it
        raise
    tune_gc()
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def running_loop_name() -> str:
    """``uvloop`` or ``asyncio``: the loop this coroutine runs on (for the start-up log)."""
    import asyncio

    return "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"
