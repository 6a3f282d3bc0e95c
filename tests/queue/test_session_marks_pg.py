"""On PostgreSQL, the count of removed daemon sessions is spread over rows by the session's
digest: two transactions that each remove a session (two daemons registering again at once, as
a DaemonSet rollout makes every daemon do) wait for each other only when their sessions share a
row, and the count read is still every removal, each counted once."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from nymph.queue.pgdb import connect_and_migrate
from nymph.queue.sql import sessions as sql
from nymph.queue.sql.dialect import pg_row_factory
from tests.support.pg_server import PgServer

#: Sessions by digest: two that share the first hex digit, one that does not.
SAME_A, SAME_B, OTHER = "0" + "a" * 63, "0" + "b" * 63, "f" + "a" * 63


@contextlib.contextmanager
def _db(pg_server: PgServer) -> Iterator[tuple[psycopg.Connection[Any], psycopg.Connection[Any]]]:
    """A fresh migrated database holding the three sessions, and two connections to it."""
    url = pg_server.fresh_database()
    try:
        connect_and_migrate(url)
        with psycopg.connect(url, autocommit=True) as setup:
            for digest in (SAME_A, SAME_B, OTHER):
                setup.execute(
                    "INSERT INTO daemon_sessions (digest, session_id, daemon_id, node, namespaces, "
                    "token_id, scope, expires_at) VALUES (%s, %s, %s, 'n', '[]', 't', NULL, 1e12)",
                    (digest, "s-" + digest[:8], "d-" + digest[:8]),
                )
        a = psycopg.connect(url, row_factory=pg_row_factory)
        b = psycopg.connect(url, row_factory=pg_row_factory)
        try:
            yield a, b
        finally:
            a.close()
            b.close()
    finally:
        pg_server.drop_database(url)


def _remove(conn: psycopg.Connection[Any], digest: str) -> None:
    conn.execute("DELETE FROM daemon_sessions WHERE digest = %s", (digest,))


def test_removals_of_sessions_in_different_rows_do_not_wait_for_each_other(pg_server: PgServer) -> None:
    with _db(pg_server) as (a, b):
        before = sql.removed(a)  # type: ignore[arg-type]
        a.commit()
        _remove(a, SAME_A)  # a's transaction stays open, holding its row of the count
        b.execute("SET lock_timeout = '2s'")
        _remove(b, OTHER)  # another row: no wait
        b.commit()
        # a session in a's row waits for a's commit
        b.execute("SET lock_timeout = '200ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            _remove(b, SAME_B)
        b.rollback()
        a.commit()
        _remove(b, SAME_B)
        b.commit()
        assert sql.removed(a) == before + 3  # type: ignore[arg-type]


def test_a_session_cut_short_and_a_truncate_are_counted(pg_server: PgServer) -> None:
    with _db(pg_server) as (a, _):
        before = sql.removed(a)  # type: ignore[arg-type]
        a.execute("UPDATE daemon_sessions SET expires_at = 1 WHERE digest = %s", (OTHER,))
        a.execute("UPDATE daemon_sessions SET expires_at = 1e13 WHERE digest = %s", (SAME_A,))  # moved on
        assert sql.removed(a) == before + 1  # type: ignore[arg-type]
        a.execute("TRUNCATE daemon_sessions")
        assert sql.removed(a) == before + 2  # type: ignore[arg-type]
        a.commit()
