"""Hash-chained audit log (JSON lines).

Each record carries ``seq`` (1, 2, ...), ``prev`` (the previous record's ``hash``; 64 zeros for
the first) and ``hash`` = sha256 of the canonical JSON of the record without ``hash``. The head
(last seq and hash) is also kept in ``<file>.head``, written atomically, so dropping the last
records is detected too. :func:`verify` names the first bad record.

Records hold what was done, to what, by whom and with what result: action, instance, task,
node, requester, manifest sha256, result, error. Never a manifest body, a script or a secret.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nymph.errors import NymphError
from nymph.logs import redact_text

GENESIS = "0" * 64
ACTIONS = frozenset({"claim", "apply", "adopt", "delete", "reap", "probe", "release", "start", "stop"})


class AuditError(NymphError):
    pass


def _canon(record: dict[str, Any]) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def record_hash(record: dict[str, Any]) -> str:
    body = {k: v for k, v in record.items() if k != "hash"}
    return hashlib.sha256(_canon(body)).hexdigest()


class AuditLog:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.head_path = self.path.with_name(self.path.name + ".head")
        self._lock = threading.Lock()
        self.seq, self.last = self._load_head()

    def _load_head(self) -> tuple[int, str]:
        seq, last = 0, GENESIS
        last_line = b""
        if self.path.exists():
            with self.path.open("rb") as fh:
                for line in fh:
                    if line.strip():
                        last_line = line
        if last_line:
            try:
                rec = json.loads(last_line)
                seq, last = int(rec["seq"]), str(rec["hash"])
            except (ValueError, KeyError, TypeError):
                raise AuditError(
                    f"{self.path}: last record is unreadable; run `nymph audit verify {self.path}`"
                ) from None
        head = self._read_head()
        if head is not None and head != (seq, last):
            # Continuing from a shortened file would rewrite the head and hide the loss.
            raise AuditError(
                f"{self.path} ends at record {seq} but its head says {head[0]}: records are missing. "
                f"Run `nymph audit verify {self.path}`, keep the file as evidence, and move it and "
                f"{self.head_path.name} aside to start a new chain"
            )
        return seq, last

    def _read_head(self) -> tuple[int, str] | None:
        try:
            head = json.loads(self.head_path.read_text())
            return int(head["seq"]), str(head["hash"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def append(self, action: str, **fields: Any) -> dict[str, Any]:
        if action not in ACTIONS:
            raise AuditError(f"unknown audit action {action!r}")
        with self._lock:
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
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
            try:
                os.write(fd, _canon(rec) + b"\n")
                os.fsync(fd)
            finally:
                os.close(fd)
            self.seq, self.last = rec["seq"], rec["hash"]
            self._write_head()
            return rec

    def _write_head(self) -> None:
        tmp = self.head_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"seq": self.seq, "hash": self.last}))
        os.replace(tmp, self.head_path)


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    records: int
    problem: str = ""
    line: int = 0


def verify(path: Path) -> VerifyResult:
    """Check the chain. Detects an edited, dropped, inserted or reordered record."""
    path = Path(path)
    if not path.exists():
        return VerifyResult(False, 0, f"{path}: no such file")
    prev, expect_seq, n = GENESIS, 1, 0
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
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
    head_path = path.with_name(path.name + ".head")
    if head_path.exists():
        with contextlib.suppress(ValueError, OSError):
            head = json.loads(head_path.read_text())
            if head.get("seq") != n or head.get("hash") != prev:
                return VerifyResult(
                    False,
                    n,
                    f"the log ends at seq {n} but its head says seq {head.get('seq')}: records were removed from the end",
                )
    return VerifyResult(True, n)
