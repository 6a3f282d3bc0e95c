"""The queue's and the daemon's event loop: uvloop by default, asyncio's own on request or where
uvloop is missing, and a clear error for a choice nymph does not know."""

from __future__ import annotations

import asyncio
import gc
import sys
import warnings

import pytest

from nymph import eventloop
from nymph.errors import ConfigError


async def _where() -> str:
    return eventloop.running_loop_name()


pytestmark = pytest.mark.usefixtures("gc_restored")


def test_run_freezes_start_up_and_collects_young_objects_less_often() -> None:
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    made_before = [{"k": [i]} for i in range(1000)]  # start-up's objects

    async def probe() -> tuple[int, tuple[int, int, int]]:
        return gc.get_freeze_count(), gc.get_threshold()

    frozen, threshold = eventloop.run(probe())
    assert threshold == (eventloop.GC_YOUNG, 10, 10)
    assert frozen >= len(made_before)
    assert eventloop.run(_where()) == "uvloop"  # a second run keeps the same settings
    assert gc.get_threshold() == (eventloop.GC_YOUNG, 10, 10)


def test_the_default_loop_is_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(eventloop.ENV, raising=False)
    assert eventloop.run(_where()) == "uvloop"
    monkeypatch.setenv(eventloop.ENV, "")
    assert eventloop.run(_where()) == "uvloop"


@pytest.mark.parametrize(
    ("value", "expected"), [("asyncio", "asyncio"), ("uvloop", "uvloop"), (" UVLOOP ", "uvloop")]
)
def test_the_environment_chooses_the_loop(monkeypatch: pytest.MonkeyPatch, value: str, expected: str) -> None:
    monkeypatch.setenv(eventloop.ENV, value)
    assert eventloop.loop_factory()[0] == expected
    assert eventloop.run(_where()) == expected


def test_an_unknown_loop_is_refused_with_the_choices_and_the_coroutine_is_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(eventloop.ENV, "trio")
    main = _where()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "coroutine was never awaited"
        with pytest.raises(ConfigError) as err:
            eventloop.run(main)
    assert (
        str(err.value)
        == "NYMPH_EVENT_LOOP='trio' is not a loop nymph knows: use one of auto, uvloop, asyncio"
    )
    assert main.cr_frame is None  # closed, never run


def test_without_uvloop_auto_falls_back_and_an_explicit_uvloop_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop raises ImportError
    assert eventloop.run(_where(), choice="auto") == "asyncio"
    with pytest.raises(
        ConfigError, match="uvloop is not installed: pip install uvloop, or unset NYMPH_EVENT_LOOP"
    ):
        eventloop.run(_where(), choice="uvloop")


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_run_ends_like_asyncio_run_tasks_left_running_are_cancelled(loop: str) -> None:
    """A task still running when the main coroutine returns is cancelled and its cleanup runs, on
    both loops, as under ``asyncio.run`` (the daemon's and queue's guarded tasks rely on it)."""
    cleaned: list[str] = []

    async def background() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            cleaned.append(eventloop.running_loop_name())

    async def main() -> int:
        task = asyncio.create_task(background(), name="left-running")
        await asyncio.sleep(0)
        return 7 if not task.done() else 0

    assert eventloop.run(main(), choice=loop) == 7
    assert cleaned == [loop]
