"""Resuming a followed container log: stamps, the cursor, de-duplication of the overlap (pure)."""

from __future__ import annotations

from nymph.launch.logcursor import (
    PARTIAL_SIZE,
    ROTATED,
    Chunker,
    Cursor,
    LineSplitter,
    parse_line,
    parse_stamp,
)
from nymph.launch.state import container_started


def _stamped(lines: list[tuple[str, bytes]]) -> bytes:
    return b"".join(f"2030-01-01T00:00:{s}Z ".encode() + text for s, text in lines)


LINES = [
    ("01.000000001", b"a\n"),
    ("01.000000002", b"b\n"),
    ("01.000000002", b"b again, same stamp\n"),
    ("01.500000000", b"c\n"),
    ("02.000000000", b"d\n"),
    ("03.000000000", b"e\n"),
]
PRINTED = b"".join(t for _, t in LINES)


def _feed(chunker: Chunker, raw: bytes, *, piece: int = 7) -> None:
    splitter = LineSplitter(max_line=1 << 20)
    for i in range(0, len(raw), piece):
        for line, continued in splitter.feed(raw[i : i + piece]):
            chunker.line(line, continued=continued)


def test_stamps_order_and_round_trip() -> None:
    a = parse_stamp("2030-01-01T00:00:01.5Z")
    b = parse_stamp("2030-01-01T00:00:01.000000002Z")
    assert a is not None and b is not None and b < a
    assert parse_stamp(a.text()) == a and a.since_time == "2030-01-01T00:00:01Z"
    assert parse_stamp("2030-01-01T00:00:01+02:00") is None  # the kubelet writes UTC
    assert Cursor.load(Cursor(offset=9, stamp=a, seen=2).dump()) == Cursor(offset=9, stamp=a, seen=2)
    assert Cursor.load("garbage") == Cursor()


def test_a_resumed_read_drops_exactly_the_overlap() -> None:
    """Ship part of the log, then re-read from the cursor's second (as sinceTime does): the
    result is the printed log, byte for byte, whatever the cut."""
    for cut in range(len(LINES) + 1):
        first = Chunker.resume(Cursor())
        _feed(first, _stamped(LINES[:cut]))
        shipped, _, cursor = first.take()
        second = Chunker.resume(Cursor.load(cursor.dump()))
        # sinceTime has second precision: the re-read starts at the cursor's second
        second_of = cursor.stamp.seconds[-2:] if cursor.stamp else "00"
        reread = [ln for ln in LINES if ln[0][:2] >= second_of]
        _feed(second, _stamped(reread))
        rest, offset, end = second.take()
        assert offset == len(shipped) and shipped + rest == PRINTED, cut
        assert end.offset == len(PRINTED)


def test_a_long_line_loses_the_stamps_of_its_partial_records() -> None:
    text = b"x" * (PARTIAL_SIZE * 2 + 10) + b"\n"
    parts = [text[:PARTIAL_SIZE], text[PARTIAL_SIZE : 2 * PARTIAL_SIZE], text[2 * PARTIAL_SIZE :]]
    raw = b"".join(b"2030-01-01T00:00:01.00000000%dZ " % i + p for i, p in enumerate(parts))
    stamp, got = parse_line(raw)
    assert stamp is not None and got == text
    # a line that merely contains a stamp-like text elsewhere is left alone
    odd = b"2030-01-01T00:00:01Z see 2030-01-01T00:00:02Z here\n"
    assert parse_line(odd)[1] == b"see 2030-01-01T00:00:02Z here\n"


def test_an_overlong_line_goes_on_in_pieces() -> None:
    splitter = LineSplitter(max_line=10)
    raw = b"2030-01-01T00:00:01Z " + b"y" * 25 + b"\nnext"
    out = [got for i in range(0, len(raw), 12) for got in splitter.feed(raw[i : i + 12])]
    assert [c for _, c in out] == [False, True, True, True] and all(len(p) <= 22 for p, _ in out)
    assert b"".join(p for p, _ in out) == b"2030-01-01T00:00:01Z " + b"y" * 25 + b"\n"
    assert splitter.rest() == (b"next", False)


def test_container_started() -> None:
    running = {"status": {"containerStatuses": [{"name": "user", "state": {"running": {}}}]}}
    waiting = {"status": {"containerStatuses": [{"name": "user", "state": {"waiting": {}}}]}}
    ended = {
        "status": {"containerStatuses": [{"name": "user", "state": {"terminated": {"containerID": "c"}}}]}
    }
    never = {"status": {"containerStatuses": [{"name": "user", "state": {"terminated": {"exitCode": 1}}}]}}
    assert container_started(running) and container_started(ended)
    assert not container_started(waiting) and not container_started(never) and not container_started({})


def test_a_resume_past_lines_the_node_rotated_away_says_so() -> None:
    first = Chunker.resume(Cursor())
    _feed(first, _stamped(LINES[:2]))
    shipped, _, cursor = first.take()
    gaps: list[int] = []
    second = Chunker.resume(cursor, on_gap=lambda: gaps.append(1))
    # the node no longer has "b" (the cursor's line) nor what followed it up to "d"
    _feed(second, _stamped(LINES[4:]))
    rest, offset, end = second.take()
    assert gaps == [1] and offset == len(shipped)
    assert rest == ROTATED + b"d\ne\n" and end.offset == len(shipped) + len(rest)
    # a plain resume (the cursor's line still there) says nothing
    third = Chunker.resume(cursor, on_gap=lambda: gaps.append(2))
    _feed(third, _stamped(LINES[1:]))
    assert gaps == [1] and shipped + third.take()[0] == PRINTED


def test_a_stream_that_leaps_ahead_of_its_arrivals_is_a_suspect() -> None:
    """A kubelet that fell behind moves on to the newest file: the stamps leap further than
    the time between the lines' arrivals. Once the stream is anchored, a quiet job's next line
    arrives later: no suspect. A suspect is marked only when its check says lines may be lost
    there."""
    gaps: list[int] = []
    c = Chunker.resume(Cursor(), on_gap=lambda: gaps.append(1), leap_seconds=2.0)
    at = 100.0
    for stamp, text in [("01.0", b"a\n"), ("01.5", b"b\n")]:
        c.line(_stamped([(stamp, text)]), continued=False, received=at)
    c.line(_stamped([("04.0", b"quiet 2.5 s, came 2.5 s later\n")]), continued=False, received=at + 2.5)
    assert [(s.before.text(), s.quiet) for s in c.suspects] == [("2030-01-01T00:00:01.500000000Z", True)]
    c.settle([False])  # still in the node's current file: the stream follows its rotations
    assert c.anchored and gaps == []
    c.line(_stamped([("09.0", b"quiet 5 s, came 5 s later\n")]), continued=False, received=at + 7.5)
    assert c.suspects == []
    # read back to back (behind), yet 5 s apart in the log, twice
    c.line(_stamped([("14.0", b"y\n")]), continued=False, received=at + 7.6)
    c.line(_stamped([("20.0", b"z\n")]), continued=False, received=at + 7.7)
    assert [(s.before.text(), s.quiet) for s in c.suspects] == [
        ("2030-01-01T00:00:09.000000000Z", False),
        ("2030-01-01T00:00:14.000000000Z", False),
    ]
    c.settle([False, True])  # the first one's line was still on the node: a pause, not a loss
    assert gaps == [1] and c.suspects == []
    data, offset, cursor = c.take()
    assert offset == 0 and data.endswith(b"later\ny\n" + ROTATED + b"z\n") and cursor.offset == len(data)
    # without arrival times (or with the check off) there is no suspect
    off = Chunker.resume(Cursor())
    off.line(_stamped([("01.0", b"a\n")]), continued=False, received=at)
    off.line(_stamped([("59.0", b"b\n")]), continued=False, received=at)
    assert off.suspects == [] and off.take()[0] == b"a\nb\n"


def test_a_stream_that_sat_on_a_rotated_file_then_skipped_the_next_is_marked() -> None:
    """The kubelet watches for rotations only from the first end of the file it opened: rotated
    before then (a re-read that started slowly), it sits at the old file's end while the job
    prints on, and at the next rotation opens the newest file, past the one it missed. Stamps
    and arrivals leap alike (the stream was quiet as long as the missed file lasted), so a
    stream not yet anchored checks every such pause and marks the lost lines."""
    gaps: list[int] = []
    c = Chunker.resume(Cursor(), on_gap=lambda: gaps.append(1), leap_seconds=1.0)
    at = 50.0
    c.line(_stamped([("01.0", b"a\n")]), continued=False, received=at)
    c.line(_stamped([("01.2", b"end of the file the stream opened\n")]), continued=False, received=at)
    # quiet 3 s (the kubelet at the end of the rotated file), then the newest file's first line
    c.line(_stamped([("04.3", b"first line after the missed file\n")]), continued=False, received=at + 3.1)
    assert [(s.before.text(), s.quiet) for s in c.suspects] == [("2030-01-01T00:00:01.200000000Z", True)]
    c.settle([True])  # that line is no longer in the node's current file
    assert gaps == [1] and not c.anchored
    data = c.take()[0]
    assert data == b"a\nend of the file the stream opened\n" + ROTATED + b"first line after the missed file\n"


def test_stamp_differences_cross_minutes_and_days() -> None:
    a = parse_stamp("2030-01-01T23:59:59.900000000Z")
    b = parse_stamp("2030-01-02T00:00:02.100000000Z")
    assert a is not None and b is not None
    assert abs(b.minus(a) - 2.2) < 1e-9 and abs(a.minus(b) + 2.2) < 1e-9


def test_a_stream_that_goes_back_to_the_start_of_its_file_ships_nothing_twice() -> None:
    """A kubelet that moved to the newest file on one rotation event reopens it from its start
    on the next, within the same stream: what was shipped is dropped, as in a re-read."""
    c = Chunker.resume(Cursor())
    _feed(c, _stamped(LINES[:4]) + _stamped(LINES[1:]) + _stamped(LINES[3:]))
    data, offset, cursor = c.take()
    assert offset == 0 and data == PRINTED and cursor.offset == len(PRINTED)


def test_a_stream_that_goes_back_exactly_to_the_last_shipped_line_ships_it_once() -> None:
    """The newest file may begin with the very line shipped last (same stamp): a repeat, not a
    new line; a new line that only shares the stamp is still shipped."""
    c = Chunker.resume(Cursor())
    _feed(c, _stamped(LINES[:4]) + _stamped(LINES[3:]))
    assert c.take()[0] == PRINTED
    c = Chunker.resume(Cursor())
    _feed(c, _stamped(LINES[:3]) + _stamped(LINES[1:]))  # back to the first of two lines stamped alike
    assert c.take()[0] == PRINTED
    c = Chunker.resume(Cursor())
    _feed(
        c, _stamped(LINES[:2]) + _stamped([("01.000000002", b"b again, same stamp\n")]) + _stamped(LINES[3:])
    )
    assert c.take()[0] == PRINTED
