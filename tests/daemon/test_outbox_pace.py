"""The outbox's pace: under load, a few sends a second of each kind, whatever the item rate."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path
from typing import Any

import pytest

from nymph.daemon.outbox import Outbox, _family
from nymph.daemon.settings import load_settings
from nymph.errors import ConfigError

IID = "lakeshore-0123abcd"
#: asyncio may wake a timer this much early (its clock's resolution, rounded up generously)
EARLY = 0.005


class Recorder:
    """A sender that records each send: when the outbox started it (before the fsync that
    precedes every send, whose time varies), its kind and its items."""

    def __init__(self, box: Outbox) -> None:
        self.box = box
        self.sends: list[tuple[float, str, list[Any]]] = []

    async def __call__(self, kind: str, batch: list[dict[str, Any]]) -> None:
        started = self.box._started.get(_family(kind) or kind, time.monotonic())
        self.sends.append((started, kind, [b.get("seq", b.get("taskId", b.get("offset"))) for b in batch]))

    def kinds(self) -> list[str]:
        return [k for _, k, _ in self.sends]


async def _stream_reports(box: Outbox, *, seconds: float, every: float) -> int:
    made = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        box.report(instance_id=IID, state="running" if made % 2 else "starting")
        made += 1
        await asyncio.sleep(every)
    return made


@pytest.mark.parametrize("pace", [0.0, 0.2])
async def test_under_load_sends_of_one_kind_start_at_most_once_per_pace(tmp_path: Path, pace: float) -> None:
    """Reports made every 10 ms for 0.8 s go out in sends at least ``pace`` apart (the first at
    once), every report once and in order; without a pace, each send goes as soon as the one
    before it ended, so the same reports take many more."""
    box = Outbox(tmp_path, pace=pace)
    rec = Recorder(box)
    task = asyncio.create_task(box.run(rec))
    try:
        made = await _stream_reports(box, seconds=0.8, every=0.01)
        assert await box.flush(timeout=20)
    finally:
        task.cancel()
    seqs = [s for _, _, items in rec.sends for s in items]
    assert seqs == list(range(1, made + 1))
    starts = [t for t, _, _ in rec.sends][:-1]  # the last send, the flush's, waits for nothing
    if pace:
        assert all(b - a >= pace - EARLY for a, b in itertools.pairwise(starts)), starts
        assert len(rec.sends) <= 0.8 / pace + 2
    else:
        assert len(rec.sends) > 0.8 / 0.2 + 2


async def test_reports_and_log_chunks_are_paced_apart_and_a_flush_does_not_wait(tmp_path: Path) -> None:
    """A log chunk's send does not wait for a report's that just started (each kind has its
    own pace, reports and completions together); a completion right after a report's send
    waits for the pace, until a flush sends it at once."""
    box = Outbox(tmp_path, pace=30.0)
    rec = Recorder(box)
    task = asyncio.create_task(box.run(rec))
    try:
        box.report(instance_id=IID, state="starting")
        await _until(lambda: len(rec.sends) == 1)
        box.log_chunk(instance_id=IID, offset=0, data=b"hello")
        await _until(lambda: len(rec.sends) == 2)
        box.complete(task_id="t1", ok=True)
        await asyncio.sleep(0.3)
        assert rec.kinds() == ["report", "logchunk"]  # the completion waits for the pace
        t0 = time.monotonic()
        assert await box.flush(timeout=20)
        assert time.monotonic() - t0 < 5
    finally:
        task.cancel()
    assert [(k, items) for _, k, items in rec.sends] == [
        ("report", [1]),
        ("logchunk", [0]),
        ("complete", ["t1"]),
    ]


async def test_a_full_batch_does_not_wait_for_the_pace(tmp_path: Path) -> None:
    """Once a batch's worth of items waits, it goes at once, whatever the pace."""
    box = Outbox(tmp_path, pace=30.0, batch_max=5)
    rec = Recorder(box)
    task = asyncio.create_task(box.run(rec))
    try:
        box.report(instance_id=IID, state="starting")
        await _until(lambda: len(rec.sends) == 1)
        for i in range(5):
            box.report(instance_id=IID, state="running" if i % 2 else "starting")
        await _until(lambda: len(rec.sends) == 2, timeout=5)
    finally:
        task.cancel()
    assert rec.sends[1][2] == [2, 3, 4, 5, 6]


async def test_large_log_chunks_go_back_to_back_whatever_the_pace(tmp_path: Path) -> None:
    """A batch that waiting could not grow goes at once: a log chunk of more than half a
    batch's bytes (a follower reading a busy log), or a run cut short by the size limit, so a
    loud job's log is not held to one chunk per pace."""
    box = Outbox(tmp_path, pace=30.0, batch_bytes=64 * 1024)
    rec = Recorder(box)
    task = asyncio.create_task(box.run(rec))
    try:
        for i in range(4):
            box.log_chunk(instance_id=IID, offset=i * 40_000, data=b"x" * 40_000)
        await _until(lambda: len(rec.sends) == 4, timeout=5)
    finally:
        task.cancel()
    assert [items for _, _, items in rec.sends] == [[0], [40_000], [80_000], [120_000]]


async def test_log_tails_go_one_per_request_without_waiting_for_the_pace(tmp_path: Path) -> None:
    """A log tail goes in a request of its own whatever the pace (pacing it would make no
    fewer requests): tails queued one after another all go at once, not one per pace."""
    box = Outbox(tmp_path, pace=30.0)
    rec = Recorder(box)
    task = asyncio.create_task(box.run(rec))
    try:
        for i in range(4):
            box.logs(instance_id=f"lakeshore-0000000{i}", text=f"tail {i}")
        await _until(lambda: len(rec.sends) == 4, timeout=5)
    finally:
        task.cancel()
    assert rec.kinds() == ["logs"] * 4


async def _until(cond: Any, *, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        await asyncio.sleep(0.01)


def test_the_pace_is_on_by_default_and_checked(tmp_path: Path) -> None:
    """A daemon paces its sends unless told not to; a pace or linger outside 0-5 s, or not a
    number, is refused with the range to use (not a TypeError)."""
    env = {"NYMPH_TOKEN": "tok"}
    assert load_settings(config_file=None, environ=env).outbox_pace > 0
    cfg = tmp_path / "d.yaml"
    for bad in ("outbox_pace: 9", "outbox_pace: fast", "outbox_linger: soon", "outbox_pace: true"):
        cfg.write_text(bad + "\nkube: {namespaces: [a]}\n")
        with pytest.raises(ConfigError, match="use 0 to 5 seconds"):
            load_settings(config_file=str(cfg), environ=env)
    cfg.write_text("outbox_pace: 0\nkube: {namespaces: [a]}\n")
    assert load_settings(config_file=str(cfg), environ=env).outbox_pace == 0
