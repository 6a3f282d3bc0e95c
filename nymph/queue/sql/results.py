"""Result files of instances: chunked uploads by a daemon (idempotent by offset, capped per
instance), listing and reading (synchronous SQL inside one transaction)."""

from __future__ import annotations

from typing import Any

from nymph.launch.logcap import overlap_skip
from nymph.queue.errors import Conflict, NotFound
from nymph.queue.models import DaemonSession
from nymph.queue.sql import binding
from nymph.queue.sql.dialect import Conn
from nymph.queue.sql.instances import instance_row
from nymph.queue.sql.rows import fetch_instance, session_may_act


def _set_error(conn: Conn, *, instance_id: str, error: str) -> None:
    conn.execute(
        "UPDATE instances SET results_error = ?, version = version + 1 WHERE instance_id = ?",
        (error[:2000], instance_id),
    )


def put_chunk(
    conn: Conn,
    *,
    session: DaemonSession,
    instance_id: str,
    path: str | None,
    offset: int,
    data: bytes,
    eof: bool,
    error: str | None,
    cap: int,
    now: float,
) -> tuple[int, str | None]:
    """Store ``data`` at ``offset`` of result file ``path`` (its new part; ``eof`` completes
    the file), and/or record the daemon's ``error``; returns the file's size after it, and
    why it was dropped when it went over the cap (kept in the instance record: the caller
    answers 409 after the commit)."""
    inst = fetch_instance(conn, instance_id)
    if inst is None or not session_may_act(session, inst):
        raise NotFound(
            f"no instance {instance_id!r}: upload results only for instances you run",
            code="instance_not_found",
        )
    binding.check_writer(conn, session=session, inst=inst, action="a result file")
    if error:
        _set_error(conn, instance_id=instance_id, error=error)
    if path is None:
        return 0, None
    row = conn.execute(
        "SELECT size, complete FROM result_files WHERE instance_id = ? AND path = ?", (instance_id, path)
    ).fetchone()
    size = int(row["size"]) if row is not None else 0
    if row is not None and row["complete"]:
        return size, None
    skip = overlap_skip(total=size, offset=offset, size=len(data))
    if skip is None:
        raise Conflict(
            f"result chunk at offset {offset} of {path!r} leaves a gap: it has {size} bytes", code="gap"
        )
    new = data[skip:]
    used = int(
        conn.execute(
            "SELECT COALESCE(SUM(size), 0) FROM result_files WHERE instance_id = ?", (instance_id,)
        ).fetchone()[0]
    )
    if used + len(new) > cap:
        message = f"the result files exceed the cap of {cap} bytes: {path} and later files were not kept"
        _set_error(conn, instance_id=instance_id, error=message)
        conn.execute("DELETE FROM result_chunks WHERE instance_id = ? AND path = ?", (instance_id, path))
        conn.execute("DELETE FROM result_files WHERE instance_id = ? AND path = ?", (instance_id, path))
        return 0, message
    if row is None:
        conn.execute(
            "INSERT INTO result_files (instance_id, path, size, complete, created_at) VALUES (?, ?, 0, 0, ?)",
            (instance_id, path, now),
        )
    if new:
        conn.execute(
            "INSERT INTO result_chunks (instance_id, path, start, data) VALUES (?, ?, ?, ?)",
            (instance_id, path, size, new),
        )
    conn.execute(
        "UPDATE result_files SET size = ?, complete = ? WHERE instance_id = ? AND path = ?",
        (size + len(new), int(eof), instance_id, path),
    )
    return size + len(new), None


def listing(conn: Conn, *, ns: str, provider: str, instance_id: str) -> dict[str, Any]:
    instance_row(conn, ns=ns, provider=provider, instance_id=instance_id)
    items = [
        {"path": r["path"], "size": int(r["size"])}
        for r in conn.execute(
            "SELECT path, size FROM result_files WHERE instance_id = ? AND complete = 1 ORDER BY path",
            (instance_id,),
        )
    ]
    error = conn.execute(
        "SELECT results_error FROM instances WHERE instance_id = ?", (instance_id,)
    ).fetchone()[0]
    return {"instanceId": instance_id, "items": items, "error": error}


def file_size(conn: Conn, *, ns: str, provider: str, instance_id: str, path: str) -> int:
    instance_row(conn, ns=ns, provider=provider, instance_id=instance_id)
    row = conn.execute(
        "SELECT size FROM result_files WHERE instance_id = ? AND path = ? AND complete = 1",
        (instance_id, path),
    ).fetchone()
    if row is None:
        raise NotFound(f"no result file {path!r} of {instance_id!r}", code="result_not_found")
    return int(row[0])


def chunks(conn: Conn, *, instance_id: str, path: str, since: int, rows: int = 8) -> list[bytes]:
    """Up to ``rows`` stored chunks of a file from offset ``since`` (cut to start there)."""
    out: list[bytes] = []
    for r in conn.execute(
        "SELECT start, data FROM result_chunks WHERE instance_id = ? AND path = ? "
        "AND start + length(data) > ? ORDER BY start LIMIT ?",
        (instance_id, path, since, rows),
    ):
        data = bytes(r["data"])
        out.append(data[max(0, since - int(r["start"])) :])
    return out
