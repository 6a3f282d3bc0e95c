"""Statements whose results are not read go to PostgreSQL with the next one (or the commit) in
one round trip: they still run in order before it, and an error one of them meets is raised in
the same transaction, which then keeps nothing."""

from __future__ import annotations

import psycopg
import pytest

from nymph.queue.sql.dialect import PgConn, pg_row_factory
from tests.support.pg_server import PgServer


def test_statements_sent_later_run_in_order_and_fail_their_transaction(pg_server: PgServer) -> None:
    """A statement sent later is seen by the next one and committed with the commit; one that
    fails is raised by the next statement, and the transaction keeps none of its writes."""
    db = pg_server.fresh_database(migrated=False)
    try:
        with psycopg.connect(db, autocommit=True, row_factory=pg_row_factory) as raw:
            raw.execute("CREATE TABLE t (k INTEGER PRIMARY KEY)")

            def keys() -> list[int]:
                return [int(r[0]) for r in raw.execute("SELECT k FROM t ORDER BY k").fetchall()]

            raw.execute("BEGIN")
            conn = PgConn(raw)
            conn.send("INSERT INTO t (k) VALUES (?)", (1,))
            conn.send("INSERT INTO t (k) VALUES (?)", (2,))
            assert [int(r[0]) for r in conn.execute("SELECT k FROM t ORDER BY k").fetchall()] == [1, 2]
            conn.send("INSERT INTO t (k) VALUES (?)", (3,))
            conn.send("UPDATE t SET k = k + 10 WHERE k = ?", (3,))
            conn.commit()
            assert keys() == [1, 2, 13]

            raw.execute("BEGIN")
            conn = PgConn(raw)
            conn.send("INSERT INTO t (k) VALUES (?)", (4,))
            conn.send("INSERT INTO t (k) VALUES (?)", (1,))  # taken
            with pytest.raises(psycopg.errors.UniqueViolation):
                conn.execute("SELECT 1")
            raw.execute("ROLLBACK")
            assert keys() == [1, 2, 13]
    finally:
        pg_server.drop_database(db)
