"""The secret store's rows: ciphertext only, per control-plane namespace (synchronous SQL inside
the caller's transaction). Encryption is :mod:`nymph.queue.secrets`'s business."""

from __future__ import annotations

from nymph.protocol import iso
from nymph.queue.errors import NotFound
from nymph.queue.sql.dialect import Conn


def put(conn: Conn, *, ns: str, name: str, ciphertext: bytes, ts: float) -> bool:
    """Insert or replace; True when the secret is new."""
    exists = conn.execute("SELECT 1 FROM secrets WHERE namespace = ? AND name = ?", (ns, name)).fetchone()
    conn.execute(
        "INSERT INTO secrets (namespace, name, ciphertext, created_at, updated_at) VALUES (?, ?, ?, ?, ?) "
        "ON CONFLICT (namespace, name) DO UPDATE SET ciphertext = excluded.ciphertext, "
        "updated_at = excluded.updated_at",
        (ns, name, ciphertext, ts, ts),
    )
    return exists is None


def get(conn: Conn, *, ns: str, name: str) -> bytes:
    row = conn.execute(
        "SELECT ciphertext FROM secrets WHERE namespace = ? AND name = ?", (ns, name)
    ).fetchone()
    if row is None:
        raise NotFound(
            f"no secret {name!r} in namespace {ns!r}: create it with 'nymph secrets set {name} "
            "--from-file FILE'",
            code="secret_not_found",
        )
    return bytes(row[0])


def listing(conn: Conn, *, ns: str) -> list[dict[str, str]]:
    rows = conn.execute(
        "SELECT name, created_at, updated_at FROM secrets WHERE namespace = ? ORDER BY name", (ns,)
    ).fetchall()
    return [{"name": r[0], "createdAt": iso(r[1]), "updatedAt": iso(r[2])} for r in rows]


def delete(conn: Conn, *, ns: str, name: str) -> None:
    cur = conn.execute("DELETE FROM secrets WHERE namespace = ? AND name = ?", (ns, name))
    if not cur.rowcount:
        get(conn, ns=ns, name=name)


def sample(conn: Conn) -> tuple[str, str, bytes] | None:
    """Any one stored secret (to check the key can read the store), or None if there are none."""
    row = conn.execute("SELECT namespace, name, ciphertext FROM secrets LIMIT 1").fetchone()
    return None if row is None else (str(row[0]), str(row[1]), bytes(row[2]))
