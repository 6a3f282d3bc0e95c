"""The stored log's offsets, cap and truncation marker (pure)."""

from __future__ import annotations

import random

from nymph.launch.logcap import (
    Dropped,
    Piece,
    keep_outside,
    marker,
    overlap_skip,
    plan_drop,
    read_from,
    resume_offset,
    utf8_complete,
)


def _store(log: bytes, *, cap: int, sizes: list[int]) -> tuple[list[Piece], Dropped]:
    """Append ``log`` in chunks of ``sizes`` under ``cap`` as the queue does."""
    pieces: list[Piece] = []
    dropped = Dropped()
    pos = 0
    for size in sizes:
        pieces.append(Piece(pos, log[pos : pos + size]))
        pos += size
        new = plan_drop(total=pos, dropped=dropped, cap=cap)
        if new != dropped:
            pieces = [k for p in pieces for k in keep_outside(p, new)]
            dropped = new
    return pieces, dropped


def test_overlap_skip_dedups_and_refuses_gaps() -> None:
    assert overlap_skip(total=10, offset=10, size=5) == 0
    assert overlap_skip(total=10, offset=7, size=5) == 3
    assert overlap_skip(total=10, offset=2, size=5) == 5  # wholly received: skipped whole
    assert overlap_skip(total=10, offset=11, size=5) is None


def test_under_the_cap_nothing_is_dropped() -> None:
    assert plan_drop(total=100, dropped=Dropped(), cap=100) == Dropped()


def test_the_oldest_middle_part_goes_and_the_head_stays() -> None:
    cap = 1000
    log = bytes(random.Random(1).randrange(256) for _ in range(5000))
    sizes = [37, 500, 1, 999, 123] * 20
    sizes = [s for s in sizes if sum(sizes[: sizes.index(s)]) < 5000]
    total = 0
    chosen = []
    for s in sizes:
        if total >= len(log):
            break
        chosen.append(min(s, len(log) - total))
        total += chosen[-1]
    pieces, dropped = _store(log, cap=cap, sizes=chosen)
    stored = sum(len(p.data) for p in pieces)
    assert stored == cap
    assert dropped.start == cap // 4 and dropped.end == len(log) - (cap - cap // 4)
    out = b"".join(read_from(pieces, since=0, dropped=dropped))
    assert out == log[: dropped.start] + marker(dropped.size) + log[dropped.end :]
    assert b"bytes of the log dropped here" in marker(7) and b" 7 " in marker(7)


def test_offsets_stay_valid_across_the_drop() -> None:
    log = b"".join(b"line %05d\n" % i for i in range(1000))
    pieces, dropped = _store(log, cap=2000, sizes=[110] * 100)
    # after the dropped range: exactly the printed bytes from there
    since = dropped.end + 55
    assert b"".join(read_from(pieces, since=since, dropped=dropped)) == log[since:]
    # inside it: the marker says how many bytes this reader misses
    since = dropped.start + 10
    out = b"".join(read_from(pieces, since=since, dropped=dropped))
    assert out == marker(dropped.end - since) + log[dropped.end :]
    # before it: the head from there, the marker, the tail
    out = b"".join(read_from(pieces, since=5, dropped=dropped))
    assert out == log[5 : dropped.start] + marker(dropped.size) + log[dropped.end :]


def test_resume_offset_skips_the_marker() -> None:
    d = Dropped(100, 900)
    assert resume_offset(since=0, received=50, dropped=d) == 50
    assert resume_offset(since=0, received=100, dropped=d) == 100
    got = 100 + len(marker(800)) + 30
    assert resume_offset(since=0, received=got, dropped=d) == 930
    got = len(marker(400)) + 7
    assert resume_offset(since=500, received=got, dropped=d) == 907
    assert resume_offset(since=950, received=10, dropped=d) == 960
    assert resume_offset(since=3, received=10, dropped=Dropped()) == 13


def test_utf8_complete_leaves_a_cut_character() -> None:
    text = "héllo €".encode()
    assert utf8_complete(text) == len(text)
    assert utf8_complete(text[:-1]) == len(text) - 3
    assert utf8_complete(text[:-2]) == len(text) - 3
    assert utf8_complete(b"abc") == 3
    assert utf8_complete(b"") == 0
