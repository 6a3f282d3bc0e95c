"""Small writes held in memory until one transaction writes them all: what many daemons' calls
leave due (their last-seen times, their sessions' expiries), which a replica writes every few
seconds rather than in a write transaction per call (an fsync each on SQLite)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from nymph.queue.db import Backend
from nymph.queue.sql.dialect import Conn


class DueWrites:
    """Key -> the value (a time) due to be written; a newer value of a key replaces the older."""

    def __init__(self, write: Callable[[Conn, Mapping[str, float]], None]) -> None:
        self._write = write
        self._due: dict[str, float] = {}

    def put(self, key: str, value: float) -> None:
        self._due[key] = value

    def get(self, key: str) -> float | None:
        return self._due.get(key)

    def discard(self, key: str) -> None:
        self._due.pop(key, None)

    async def flush(self, db: Backend) -> int:
        """Write every value due in one transaction; how many. A failed write keeps them for
        the next flush (a value put meanwhile wins)."""
        if not self._due:
            return 0
        due, self._due = self._due, {}
        try:
            await db.write(lambda conn: self._write(conn, due))
        except BaseException:
            for key, value in due.items():
                self._due.setdefault(key, value)
            raise
        return len(due)
