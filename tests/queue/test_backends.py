"""Choosing the backend: ``--db PATH`` or ``sqlite:///PATH`` keeps SQLite, ``--db
postgresql://...`` or ``NYMPH_DB_URL`` selects PostgreSQL; the shared SQL's placeholder
translation; the schema applied once by concurrent starters."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest

from nymph.cli.queue import DB_URL_ENV, _db_path
from nymph.queue.pgdb import connect_and_migrate, describe
from nymph.queue.sql.dialect import translate
from nymph.queue.sql.pg_migrations import PG_MIGRATIONS
from tests.support.pg_server import PgServer


def test_db_argument_and_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(DB_URL_ENV, raising=False)
    assert _db_path(argparse.Namespace(db=str(tmp_path / "q.db"))) == tmp_path / "q.db"
    assert _db_path(argparse.Namespace(db=f"sqlite:///{tmp_path}/q.db")) == tmp_path / "q.db"
    url = "postgresql://nymph@db.example/nymph"
    assert _db_path(argparse.Namespace(db=url)) == url
    monkeypatch.setenv(DB_URL_ENV, url)
    assert _db_path(argparse.Namespace(db=None)) == url
    assert _db_path(argparse.Namespace(db=str(tmp_path / "q.db"))) == tmp_path / "q.db"  # --db wins


def test_placeholders_translate_outside_quotes_only() -> None:
    assert translate("SELECT a FROM t WHERE b = ? AND c = :name") == (
        "SELECT a FROM t WHERE b = %s AND c = %(name)s"
    )
    assert translate("SELECT '?', ':x', 'it''s ?' FROM t WHERE d LIKE '5%' AND e = ?") == (
        "SELECT '?', ':x', 'it''s ?' FROM t WHERE d LIKE '5%%' AND e = %s"
    )
    assert translate("SELECT x::text") == "SELECT x::text"


def test_the_url_never_shows_its_password() -> None:
    shown = describe("postgresql://nymph:s3cr3t-pw@db.example:5433/queue")
    assert "s3cr3t-pw" not in shown and "db.example:5433/queue" in shown


def test_concurrent_starters_migrate_once(pg_server: PgServer) -> None:
    url = pg_server.fresh_database(migrated=False)
    try:
        with ThreadPoolExecutor(4) as pool:
            versions = list(pool.map(lambda _: connect_and_migrate(url), range(4)))
        assert versions == [len(PG_MIGRATIONS)] * 4
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT version FROM nymph_schema").fetchall() == [(len(PG_MIGRATIONS),)]
    finally:
        pg_server.drop_database(url)


def test_token_create_on_postgresql_from_the_environment(pg_server: PgServer, tmp_path: Path) -> None:
    url = pg_server.fresh_database(migrated=False)
    try:
        out = subprocess.run(
            [sys.executable, "-m", "nymph.cli", "queue", "token", "create", "--role", "user"],
            env={**os.environ, DB_URL_ENV: url},
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
        assert out.returncode == 0, out.stderr
        token = out.stdout.split()[-1]
        assert "postgresql" in out.stdout and token.startswith("nyq_")
        with psycopg.connect(url) as conn:
            rows = conn.execute("SELECT hash, role FROM tokens").fetchall()
        assert len(rows) == 1 and rows[0][1] == "user" and token not in repr(rows)
        assert not list(tmp_path.iterdir())  # no SQLite file made on the side
    finally:
        pg_server.drop_database(url)
