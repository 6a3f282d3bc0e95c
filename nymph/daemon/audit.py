"""Hash-chained audit log (JSON lines).

Each record carries ``seq`` (1, 2, ...), ``prev`` (the previous record's ``hash``; 64 zeros for
the first) and ``hash`` = sha256 of the canonical JSON of the record without ``hash``. The head
(last seq and hash) is also kept in ``<file>.head``, rewritten in place at a fixed width, so
dropping the last records is detected too. :func:`verify` names the first bad record.

Records hold what was done, to what, by whom and with what result: action, instance, task,
node, requester, manifest sha256, result, error. Never a manifest body, a script or a secret.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import json
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nymph import fastjson
from nymph.daemon.durable import Appender, TornAppend, Writer, truncate_to, write_in_place
from nymph.errors import NymphError
from nymph.logsetup import redact_text

GENESIS = "0" * 64
GENESIS_SEQ = 0
#: The head file's width before its newline: room for any seq and hash, so each write covers
#: the whole of the last one.
HEAD_WIDTH = 127
ACTIONS = frozenset(
    {
        "claim",
        "apply",
        "adopt",
        "delete",
        "reap",
        "probe",
        "release",
        "start",
        "stop",
        "recover",
        "refuse",
        "log-gap",
    }
)


class AuditError(NymphError):
    pass


class AuditWriteError(AuditError):
    """An append could not be made durable (disk full, read-only root...). The record is not in
    the log; the caller must not act as if it were."""


def _canon(record: dict[str, Any]) -> bytes:
    # The same bytes as json.dumps(sort_keys, compact, ensure_ascii=False), which chains written
    # before were hashed with; by orjson wherever it writes exactly those.
    return fastjson.canonical(record)


def record_hash(record: dict[str, Any]) -> str:
    body = {k: v for k, v in record.items() if k != "hash"}
    return hashlib.sha256(_canon(body)).hexdigest()


def _parse(line: bytes) -> dict[str, Any] | None:
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    if (
        not isinstance(rec, dict)
        or not isinstance(rec.get("seq"), int)
        or not isinstance(rec.get("hash"), str)
    ):
        return None
    return rec


def _scan(path: Path) -> tuple[bytes, int, int]:
    """The last whole non-blank line, the length of the whole lines, and the torn tail's length."""
    last, whole, pos = b"", 0, 0
    if not path.exists():
        return last, whole, pos
    with path.open("rb") as fh:
        for line in fh:
            pos += len(line)
            if not line.endswith(b"\n"):
                return last, whole, len(line)
            whole = pos
            if line.strip():
                last = line
    return last, whole, 0


def _tail_records(path: Path, *, count: int, end: int) -> list[dict[str, Any] | None]:
    """The last ``count`` non-blank records among the first ``end`` bytes (None where unreadable)."""
    tail: deque[bytes] = deque(maxlen=count)
    pos = 0
    with path.open("rb") as fh:
        for line in fh:
            pos += len(line)
            if pos > end:
                break
            if line.strip():
                tail.append(line)
    return [_parse(line) for line in tail]


class AuditLog:
    """Appends records; opening it repairs what a crash can leave and refuses what it cannot.

    A crash can leave the log ahead of its head (whole records written, head not yet rewritten)
    or a torn last line (a write cut short). Opening catches the head up, or cuts the torn tail,
    and records a ``recover`` entry saying so. A log behind its head, a record that does not match
    its head, or a broken chain after it is tampering: :class:`AuditError`.
    """

    def __init__(self, path: Path, *, write: Writer | None = None, grouped: bool = False) -> None:
        """``grouped``: each record is written at once (a killed process loses none) but made
        durable by :meth:`sync`, one fsync (and one head) for every record since the last one;
        the caller syncs before anything that depends on the records (see the daemon). Else
        every :meth:`append` is durable when it returns."""
        self.path = Path(path)
        self.grouped = grouped
        self.unsynced = 0  # records written since the last sync (grouped)
        self._head_seq = -1  # the seq of the head last written
        self.head_path = self.path.with_name(self.path.name + ".head")
        #: The log, held open for its appends and syncs.
        self._appender = Appender(self.path)
        self._lock = threading.Lock()
        self._write = write  # a seam for tests injecting a failing write
        self._repair_to: int | None = None
        self._pending: list[dict[str, Any]] = []  # recovery records not yet written (disk full)
        self.seq, self.last = GENESIS_SEQ, GENESIS
        self._open()

    def _open(self) -> None:
        last_line, whole, torn = _scan(self.path)
        seq, last = GENESIS_SEQ, GENESIS
        if last_line:
            rec = _parse(last_line)
            if rec is None:
                raise AuditError(
                    f"{self.path}: last record is unreadable; run `nymph audit verify {self.path}`"
                )
            seq, last = int(rec["seq"]), str(rec["hash"])
        head = self._read_head()
        behind = 0
        if head is not None and head != (seq, last):
            if head[0] >= seq:
                # Continuing from a shortened file would rewrite the head and hide the loss.
                raise AuditError(
                    f"{self.path} ends at record {seq} but its head says {head[0]}: records are missing "
                    f"or altered. Run `nymph audit verify {self.path}`, keep the file as evidence, and "
                    f"move it and {self.head_path.name} aside to start a new chain"
                )
            self._check_ahead(head=head, seq=seq, end=whole)
            behind = seq - head[0]
        # Only now, with nothing found that is tampering, repair what a crash left.
        if torn:
            try:
                truncate_to(self.path, whole)
            except OSError:
                self._repair_to = whole  # a read-only root: cut before the next append
        self.seq, self.last = seq, last
        if behind:
            with contextlib.suppress(OSError):
                self._write_head()
            self._pending.append({"event": "head-recovered", "records": behind})
        if torn:
            self._pending.append({"event": "torn-tail-truncated", "bytes": torn})
        # Opening never fails for want of space: what cannot be recorded now is recorded first
        # by the next append that can be written.
        with contextlib.suppress(AuditWriteError), self._lock:
            self._flush_pending()

    def _flush_pending(self) -> None:
        while self._pending:
            self._append_locked("recover", self._pending[0])
            self._pending.pop(0)

    def _check_ahead(self, *, head: tuple[int, str], seq: int, end: int) -> None:
        """The records after the head must be whole, valid and chained to it."""
        head_seq, prev = head
        anchor = 1 if head_seq > 0 else 0
        records = _tail_records(self.path, count=seq - head_seq + anchor, end=end)
        if anchor:
            first = records.pop(0) if records else None
            if (
                first is None
                or first.get("seq") != head_seq
                or first.get("hash") != prev
                or (record_hash(first) != prev)
            ):
                raise AuditError(
                    f"{self.path}: record {head_seq} does not match its head: the log was altered. "
                    f"Run `nymph audit verify {self.path}` and keep the file as evidence"
                )
        for expect, rec in enumerate(records, start=head_seq + 1):
            if (
                rec is None
                or rec.get("seq") != expect
                or rec.get("prev") != prev
                or (record_hash(rec) != rec["hash"])
            ):
                raise AuditError(
                    f"{self.path}: the records after its head (seq {head_seq}) do not chain: the log "
                    f"was altered. Run `nymph audit verify {self.path}` and keep the file as evidence"
                )
            prev = str(rec["hash"])

    def _read_head(self) -> tuple[int, str] | None:
        return _read_head_file(self.head_path)

    def append(self, action: str, **fields: Any) -> dict[str, Any]:
        """Append one record, durably. :class:`AuditWriteError` when it cannot be written; the
        log is then left as it was (or is cut back to it before the next append)."""
        if action not in ACTIONS:
            raise AuditError(f"unknown audit action {action!r}")
        with self._lock:
            self._flush_pending()
            return self._append_locked(action, fields)

    def _append_locked(self, action: str, fields: dict[str, Any]) -> dict[str, Any]:
        rec: dict[str, Any] = {
            "seq": self.seq + 1,
            "ts": dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
            "action": action,
        }
        for k, v in sorted(fields.items()):
            if v is not None:
                rec[k] = redact_text(v) if isinstance(v, str) else v
        rec["prev"] = self.last
        rec["hash"] = record_hash(rec)
        line = _canon(rec) + b"\n"
        try:
            if self._repair_to is not None:
                truncate_to(self.path, self._repair_to)
                self._repair_to = None
            try:
                self._appender.append(line, write=self._write, sync=not self.grouped)
            except FileNotFoundError:  # its directory is gone (made at the first record only)
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._appender.append(line, write=self._write, sync=not self.grouped)
        except TornAppend as exc:
            self._repair_to = exc.keep
            raise AuditWriteError(f"cannot append to the audit log {self.path}: {exc.strerror}") from None
        except OSError as exc:
            raise AuditWriteError(
                f"cannot append to the audit log {self.path}: {exc.strerror or exc}"
            ) from None
        self.seq, self.last = rec["seq"], rec["hash"]
        if self.grouped:
            self.unsynced += 1
            return rec  # the head is written by the sync that makes the record durable
        # The record is durable. A head that could not be rewritten lags behind whole,
        # chained records, which the next open catches up; the next append retries it.
        with contextlib.suppress(OSError):
            self._write_head()
        return rec

    def sync(self) -> int:
        """Make every record written before the call durable (one fsync), then rewrite the
        head; the number of records it made durable. :class:`AuditWriteError` when the fsync
        fails (the records stay unsynced and the next call tries again). Appends go on while
        the disk works: the lock is not held during the fsync."""
        with self._lock:
            count, seq, last = self.unsynced, self.seq, self.last
        if not count:
            return 0
        try:
            self._appender.fsync()
        except OSError as exc:
            raise AuditWriteError(
                f"cannot make the audit log {self.path} durable: {exc.strerror or exc}"
            ) from None
        with self._lock:
            self.unsynced -= count
            if seq >= self._head_seq:
                with contextlib.suppress(OSError):
                    self._write_head(seq, last)
        return count

    async def synced(self) -> int:
        """:meth:`sync`, in a thread (the event loop runs on while the disk works)."""
        if not self.unsynced:
            return 0
        return await asyncio.to_thread(self.sync)

    def _write_head(self, seq: int | None = None, last: str | None = None) -> None:
        # Not fsynced: the records are (append_whole, or the sync that writes it), and a head
        # that lags behind whole, chained records is a state the next open accepts and records
        # (head-recovered).
        # Written over itself at a fixed width (no temp file, no rename: a new inode at every
        # sync cost more than the sync's fsync); a write of one page is never torn by a kill,
        # and a head cut by a power loss reads as none, as a missing one does.
        seq, last = (self.seq, self.last) if seq is None or last is None else (seq, last)
        head = json.dumps({"seq": seq, "hash": last}).ljust(HEAD_WIDTH) + "\n"
        write_in_place(self.head_path, head.encode())
        self._head_seq = seq


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    records: int
    problem: str = ""
    line: int = 0
    notes: tuple[str, ...] = ()  # crash states the daemon repairs at its next start


def _read_head_file(path: Path) -> tuple[int, str] | None:
    try:
        head = json.loads(path.read_text())
        return int(head["seq"]), str(head["hash"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def verify(path: Path) -> VerifyResult:
    """Check the chain. Detects an edited, dropped, inserted or reordered record.

    Two states a crash leaves are not tampering and are reported as notes: whole, chained
    records beyond the head (the head was not yet rewritten) and a torn last line without a
    newline (a write cut short). The daemon repairs both when it next opens the log.
    """
    path = Path(path)
    if not path.exists():
        return VerifyResult(False, 0, f"{path}: no such file")
    head = _read_head_file(path.with_name(path.name + ".head"))
    prev, expect_seq, n = GENESIS, 1, 0
    at_head = GENESIS if head is not None and head[0] == 0 else ""
    notes: list[str] = []
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if not raw.endswith(b"\n"):
                notes.append(f"a torn last line of {len(raw)} bytes (a write cut short) follows record {n}")
                break
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw)
            except ValueError:
                return VerifyResult(False, n, "not valid JSON", lineno)
            if not isinstance(rec, dict) or "hash" not in rec:
                return VerifyResult(False, n, "record without a hash", lineno)
            seq = rec.get("seq")
            if rec.get("prev") != prev:
                what = (
                    "a record before it was removed or reordered"
                    if seq != expect_seq
                    else "its link to the previous record was altered"
                )
                return VerifyResult(False, n, f"record seq={seq}: chain broken ({what})", lineno)
            if seq != expect_seq:
                return VerifyResult(False, n, f"record seq={seq}: expected seq {expect_seq}", lineno)
            if record_hash(rec) != rec["hash"]:
                return VerifyResult(
                    False, n, f"record seq={seq}: content does not match its hash (edited)", lineno
                )
            prev, expect_seq, n = rec["hash"], expect_seq + 1, n + 1
            if head is not None and head[0] == n:
                at_head = prev
    if head is not None:
        if head[0] > n:
            return VerifyResult(
                False,
                n,
                f"the log ends at seq {n} but its head says seq {head[0]}: records were removed from the end",
            )
        if at_head != head[1]:
            return VerifyResult(False, n, f"record seq={head[0]} does not match the head's hash (edited)")
        if head[0] < n:
            notes.append(
                f"{n - head[0]} whole, chained records after the head (seq {head[0]}): a crash came "
                "between an append and the head update"
            )
    return VerifyResult(True, n, notes=tuple(notes))
