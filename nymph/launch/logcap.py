"""An instance's stored log: byte offsets, the size cap and the truncation marker (pure).

Offsets count bytes of the log *as the job printed it*: byte ``n`` of the log keeps offset ``n``
whatever is dropped later, so a reader's ``since=OFFSET`` stays valid. When the stored bytes
exceed the cap, the oldest part after a fixed head is dropped: the log keeps its first
``cap // 4`` bytes and its latest bytes, and the dropped range ``[start, end)`` only grows at its
end. A reader crossing that range gets :func:`marker` in place of the missing bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

#: The default cap on an instance's stored log.
DEFAULT_LOG_CAP = 8 * 1024 * 1024
#: How much of the cap the log's beginning keeps once the middle is dropped.
HEAD_SHARE = 4


def marker(dropped: int) -> bytes:
    """What a reader sees in place of ``dropped`` missing bytes."""
    return f"\n[nymph: {dropped} bytes of the log dropped here]\n".encode()


@dataclass(frozen=True)
class Dropped:
    """The dropped range ``[start, end)`` of a log (empty when ``start == end``)."""

    start: int = 0
    end: int = 0

    @property
    def size(self) -> int:
        return self.end - self.start

    def __bool__(self) -> bool:
        return self.end > self.start


def head_size(cap: int) -> int:
    return max(0, cap // HEAD_SHARE)


def plan_drop(*, total: int, dropped: Dropped, cap: int) -> Dropped:
    """The dropped range after the log has grown to ``total`` bytes: as it was while the stored
    bytes fit ``cap``, else extended at its end (starting after the head) until they fit."""
    stored = total - dropped.size
    if stored <= cap:
        return dropped
    start = dropped.start if dropped else head_size(cap)
    end = max(dropped.end, start) + (stored - cap)
    return Dropped(start=start, end=min(end, total))


@dataclass(frozen=True)
class Piece:
    """A stored chunk (or the part of one that is kept): its offset and bytes."""

    offset: int
    data: bytes

    @property
    def end(self) -> int:
        return self.offset + len(self.data)


def keep_outside(piece: Piece, dropped: Dropped) -> list[Piece]:
    """The parts of ``piece`` outside the dropped range (none, one or two)."""
    if not dropped or piece.end <= dropped.start or piece.offset >= dropped.end:
        return [piece]
    out: list[Piece] = []
    if piece.offset < dropped.start:
        out.append(Piece(piece.offset, piece.data[: dropped.start - piece.offset]))
    if piece.end > dropped.end:
        out.append(Piece(dropped.end, piece.data[dropped.end - piece.offset :]))
    return out


def overlap_skip(*, total: int, offset: int, size: int) -> int | None:
    """How many leading bytes of a chunk at ``offset`` the log already has (None: a gap, the
    chunk starts after the log's end). A chunk wholly received is skipped whole (``size``)."""
    if offset > total:
        return None
    return min(size, total - offset)


def read_from(pieces: Iterable[Piece], *, since: int, dropped: Dropped) -> Iterator[bytes]:
    """The log from offset ``since`` on, with the marker where the reader crosses (or starts in)
    the dropped range; ``pieces`` are the stored chunks in offset order."""
    pos = since
    for piece in pieces:
        if piece.end <= pos:
            continue
        if dropped and pos < dropped.end and piece.offset >= dropped.start:
            yield marker(dropped.end - max(pos, dropped.start))
            pos = dropped.end
            if piece.end <= pos:
                continue
        start = max(0, pos - piece.offset)
        yield piece.data[start:]
        pos = piece.end


def utf8_complete(data: bytes) -> int:
    """How many leading bytes of ``data`` end on a UTF-8 character boundary (a multi-byte
    character cut at the end is left for the next read)."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        b = data[n - back]
        if b < 0x80:
            return n  # ASCII: complete
        if b >= 0xC0:  # a lead byte: is its sequence whole?
            need = 2 if b < 0xE0 else 3 if b < 0xF0 else 4
            return n if back >= need else n - back
    return n


def resume_offset(*, since: int, received: int, dropped: Dropped) -> int:
    """The log offset a reader reached after ``received`` bytes of a read from ``since`` that
    crossed (or started in) ``dropped`` as it was when the read began: where to resume."""
    if not dropped or since >= dropped.end:
        return since + received
    head = max(0, dropped.start - since)
    if received <= head:
        return since + received
    mark = len(marker(dropped.end - max(since, dropped.start)))
    return dropped.end + max(0, received - head - mark)
