"""Resuming a followed container log without gaps or duplicates (pure).

The API server serves a container's log with ``timestamps=true`` as lines ``<RFC3339Nano> <text>``
(the time the runtime recorded the line). A follower keeps a :class:`Cursor`: how many bytes of
the log it has shipped, the timestamp of the last shipped line and how many shipped lines carry
exactly that timestamp. After a break it asks again from that timestamp's second (``sinceTime``
has second precision) and :class:`Dedup` drops the overlap: lines older than the cursor, and the
first ``seen`` lines of the cursor's own timestamp.

A re-read that does not find the cursor's own line may have lost lines to the node's log rotation:
the kubelet serves only a container's current log file, so the lines of a rotated file that was
not read to its end are out of reach. The API server gives no way to tell a rotated file that was
read to its end from one that was not, so such a re-read always puts :data:`ROTATED` in the log
("lines may be missing"). Within one stream, a kubelet that fell behind moves on to the newest
file when it notices a rotation, skipping any file in between: the stream then leaps ahead in
time. A :class:`Chunker` given arrival times notes such a leap as a *suspect*: consecutive lines
whose stamps lie further apart than their arrivals by more than ``leap_seconds`` (which a follower
that keeps up never sees: a quiet job's next line also arrives later). A follower that caught up
after a break sees the same shape when the job paused, so the follower checks each suspect (is
the last line before it still in the node's current file?) and :meth:`Chunker.settle` marks only
those that could have lost lines.

A stream's first file is the exception to "a quiet job's next line also arrives later": the
kubelet starts watching for rotations only when it first reaches the end of the file it opened.
If the node rotated that file before then (a follower that reads slowly, just after a re-read),
the kubelet misses the new file, sits at the end of the old one (the stream goes quiet while the
job prints on) and moves on only at the next rotation, to the file after the one it missed:
stamps and arrivals then leap alike. So until a stream is *anchored* every gap in stamps over
``leap_seconds`` is a suspect; a stream is anchored once a suspect the stream was quiet before
(the kubelet sat at the end of its file) is found still in the node's current file: the kubelet
was watching that file, and sees every rotation after it.

The runtime splits a line longer than its limit (16 KiB in containerd) into partial records and
the API server prefixes each with its own timestamp; :func:`parse_line` cuts those stamps back
out of a joined line so the shipped bytes are what the job printed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import NamedTuple

#: Put in the log where the node rotated lines away before they could be read.
ROTATED = b"\n[nymph: the node rotated the log before it was all read: lines may be missing here]\n"
#: containerd's default ``max_container_log_line_size``: where a long line is split.
PARTIAL_SIZE = 16 * 1024
_STAMP = re.compile(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d) ")
_STAMP_TEXT = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)$")


@dataclass(frozen=True, order=True)
class Stamp:
    """A log line's timestamp as (UTC text up to seconds, nanoseconds), ordered."""

    seconds: str
    nanos: int

    @property
    def since_time(self) -> str:
        """The ``sinceTime`` that re-reads from this stamp's second."""
        return self.seconds + "Z"

    def text(self) -> str:
        return f"{self.seconds}.{self.nanos:09d}Z"

    def minus(self, other: Stamp) -> float:
        """Seconds from ``other`` to this stamp."""
        whole = datetime.fromisoformat(self.seconds) - datetime.fromisoformat(other.seconds)
        return whole.total_seconds() + (self.nanos - other.nanos) / 1e9


def parse_stamp(text: str) -> Stamp | None:
    m = _STAMP_TEXT.match(text)
    if m is None or m.group(3) != "Z":
        return None  # the kubelet writes UTC; anything else is not a stamp of its
    frac = (m.group(2) or "").ljust(9, "0")
    return Stamp(m.group(1), int(frac))


def parse_line(raw: bytes, *, partial_size: int = PARTIAL_SIZE) -> tuple[Stamp | None, bytes]:
    """Split ``<stamp> <text>`` into the stamp and the text as printed (the stamps of a long
    line's later partial records removed); a line without a stamp is returned whole."""
    head, sep, rest = raw.partition(b" ")
    stamp = parse_stamp(head.decode("ascii", errors="replace")) if sep else None
    if stamp is None:
        return None, raw
    return stamp, b"".join(_unsplit(rest, partial_size=partial_size))


def _unsplit(text: bytes, *, partial_size: int) -> Iterator[bytes]:
    while len(text) > partial_size:
        m = _STAMP.match(text, partial_size)
        if m is None:
            break
        yield text[:partial_size]
        text = text[m.end() :]
    yield text


@dataclass(frozen=True)
class Cursor:
    """How far a log was shipped: ``offset`` bytes, up to a line stamped ``stamp`` (the
    ``seen``-th line with that stamp)."""

    offset: int = 0
    stamp: Stamp | None = None
    seen: int = 0

    def dump(self) -> str:
        return f"{self.offset} {self.stamp.text() if self.stamp else '-'} {self.seen}"

    @staticmethod
    def load(text: str | None) -> Cursor:
        parts = (text or "").split()
        if len(parts) != 3 or not parts[0].isdigit() or not parts[2].isdigit():
            return Cursor()
        return Cursor(offset=int(parts[0]), stamp=parse_stamp(parts[1]), seen=int(parts[2]))

    def after(self, stamp: Stamp | None, size: int) -> Cursor:
        """The cursor once a line of ``size`` bytes stamped ``stamp`` is shipped."""
        if stamp is None or stamp == self.stamp:
            return replace(self, offset=self.offset + size, seen=self.seen + (stamp is not None))
        return Cursor(offset=self.offset + size, stamp=stamp, seen=1)


class Dedup:
    """Drops the lines of a re-read that the cursor says were already shipped."""

    def __init__(self, cursor: Cursor) -> None:
        self.mark = cursor.stamp
        self.skip_same = cursor.seen
        #: The re-read began after the cursor's own line: the node no longer has it (rotated
        #: away), so lines between it and this one may be lost.
        self.gap = False

    def fresh(self, stamp: Stamp | None) -> bool:
        """Whether a line stamped ``stamp`` is new (lines come in stamp order)."""
        if self.mark is None or stamp is None:
            return True
        if stamp > self.mark and self.skip_same > 0:
            self.gap = True  # the first line of the re-read is past the last one shipped
        if stamp < self.mark:
            return False
        if stamp == self.mark and self.skip_same > 0:
            self.skip_same -= 1
            return False
        self.mark = None  # past the overlap: everything from here is new
        return True


class LineSplitter:
    """Bytes as they arrive -> whole lines, holding at most ``max_line`` bytes of an unfinished
    one (a longer line is handed on in pieces, the later ones without a stamp)."""

    def __init__(self, *, max_line: int = 1024 * 1024) -> None:
        self.max_line = max_line
        self.buf = bytearray()
        self.continued = False

    def feed(self, data: bytes) -> list[tuple[bytes, bool]]:
        """``(line, continued)`` pairs: ``continued`` means it goes on an earlier piece."""
        self.buf += data
        out: list[tuple[bytes, bool]] = []
        start = 0
        while True:
            nl = self.buf.find(b"\n", start)
            if nl < 0:
                break
            out.append((bytes(self.buf[start : nl + 1]), self.continued))
            self.continued = False
            start = nl + 1
        del self.buf[:start]
        if len(self.buf) >= self.max_line:
            out.append((bytes(self.buf), self.continued))
            self.buf.clear()
            self.continued = True
        return out

    def rest(self) -> tuple[bytes, bool] | None:
        """An unfinished last line (the stream ended without its newline)."""
        if not self.buf:
            return None
        piece = bytes(self.buf)
        self.buf.clear()
        return piece, self.continued


class Suspect(NamedTuple):
    """A line where the stream may have leapt past lines the node rotated away."""

    at: int  # where in the chunker's buffer the leaping line starts
    before: Stamp  # the stamp of the line before it
    quiet: bool  # the stream was quiet (for over ``leap_seconds``) between the two


@dataclass
class Chunker:
    """Lines in, chunks out: drops the overlap with what was shipped and keeps the cursor (pure)."""

    cursor: Cursor
    dedup: Dedup
    buf: bytearray
    skipping: bool = False  # the later pieces of a line that was shipped already
    gaps: int = 0  # how many times the node had rotated lines away before they were read
    #: Told of each such gap (the follower logs and audits it).
    on_gap: Callable[[], None] | None = field(default=None, compare=False)
    #: Note a leap ahead within the stream (see the module's doc); None: only re-reads.
    leap_seconds: float | None = None
    last: tuple[Stamp, float] | None = None  # the last fresh line's stamp and arrival
    #: Leaps not settled yet.
    suspects: list[Suspect] = field(default_factory=list)
    #: The stream is known to follow the node's rotations (see the module's doc): until then
    #: every gap in stamps over ``leap_seconds`` is a suspect, whatever the arrivals.
    anchored: bool = False
    #: The lines shipped (as read, stamp included) that carry the cursor's own stamp: a stream
    #: that goes back exactly to one of them is told from a new line with the same stamp.
    same_stamp: list[bytes] = field(default_factory=list)

    @staticmethod
    def resume(
        cursor: Cursor, *, on_gap: Callable[[], None] | None = None, leap_seconds: float | None = None
    ) -> Chunker:
        return Chunker(
            cursor=cursor, dedup=Dedup(cursor), buf=bytearray(), on_gap=on_gap, leap_seconds=leap_seconds
        )

    def line(self, raw: bytes, *, continued: bool, received: float | None = None) -> None:
        """Take one line (or a later piece of a long one); ``received``: when it arrived, in
        seconds of the time spent waiting for the stream, for the leap check. Settle
        :attr:`suspects` before :meth:`take`."""
        if continued:
            if not self.skipping:
                self.buf += raw
                self.cursor = self.cursor.after(None, len(raw))
            return
        stamp, text = parse_line(raw)
        if self.dedup.mark is None and self._went_back(stamp, raw):
            # The stream went back: a kubelet that moved to the newest file on one rotation
            # event reopens it, from its start, on the next. Drop what was shipped, as a re-read.
            self.dedup = Dedup(self.cursor)
        self.skipping = not self.dedup.fresh(stamp)
        if self.dedup.gap:
            self.dedup.gap = False
            self._mark(len(self.buf))
        if self.skipping:
            return
        suspect = self._leapt(stamp, received)
        if suspect is not None:
            self.suspects.append(suspect)
        self.buf += text
        if stamp is None or stamp != self.cursor.stamp:
            self.same_stamp.clear()
        if stamp is not None:
            self.same_stamp.append(raw)
        self.cursor = self.cursor.after(stamp, len(text))

    def _went_back(self, stamp: Stamp | None, raw: bytes) -> bool:
        """Whether a line stamped ``stamp`` lies at or before the last one shipped."""
        at = self.cursor.stamp
        if stamp is None or at is None:
            return False
        return stamp < at or (stamp == at and raw in self.same_stamp)

    def settle(self, lost: list[bool]) -> None:
        """Mark the suspects (in order) whose check says lines may be lost there; one the
        stream was quiet before that lost nothing anchors the stream."""
        for suspect, gap in reversed(list(zip(self.suspects, lost, strict=True))):
            if gap:
                self._mark(suspect.at)
            elif suspect.quiet:
                self.anchored = True
        self.suspects.clear()

    def _mark(self, at: int) -> None:
        self.buf[at:at] = ROTATED
        self.cursor = self.cursor.after(None, len(ROTATED))
        self.gaps += 1
        if self.on_gap is not None:
            self.on_gap()

    def _leapt(self, stamp: Stamp | None, received: float | None) -> Suspect | None:
        """A suspect, if the stream may have leapt from the last line to this one."""
        if self.leap_seconds is None or stamp is None or received is None:
            return None
        last, self.last = self.last, (stamp, received)
        if last is None:
            return None
        ahead, waited = stamp.minus(last[0]), received - last[1]
        if ahead <= self.leap_seconds or (self.anchored and ahead - waited <= self.leap_seconds):
            return None
        return Suspect(at=len(self.buf), before=last[0], quiet=waited > self.leap_seconds)

    def take(self) -> tuple[bytes, int, Cursor]:
        """The buffered bytes, the offset they start at, and the cursor after them."""
        assert not self.suspects, "settle the suspects first"
        data = bytes(self.buf)
        self.buf.clear()
        return data, self.cursor.offset - len(data), self.cursor
