"""Namespaces' scheduling settings (synchronous SQL inside the caller's transaction)."""

from __future__ import annotations

import json
from fractions import Fraction

from nymph.queue.scheduling import Quota
from nymph.queue.sql.dialect import Conn, Row


def _quota(row: Row) -> Quota:
    resources = json.loads(row["resources"]) if row["resources"] else {}
    return Quota(
        weight=Fraction(str(row["weight"])),
        max_running=row["max_running"],
        resources={str(k): Fraction(str(v)) for k, v in resources.items()},
        max_runtime=row["max_runtime"],
        default_runtime=row["default_runtime"],
    )


def all_quotas(conn: Conn) -> dict[str, Quota]:
    return {r["namespace"]: _quota(r) for r in conn.execute("SELECT * FROM quotas")}


QUOTA_ROW = "SELECT * FROM quotas WHERE namespace = ?"


def get_quota(conn: Conn, namespace: str) -> Quota:
    return quota_of(conn.execute(QUOTA_ROW, (namespace,)).fetchone())


def quota_of(row: Row | None) -> Quota:
    """The quota read by :data:`QUOTA_ROW` (no row: the defaults)."""
    return Quota() if row is None else _quota(row)


def put_quota(conn: Conn, namespace: str, quota: Quota, *, now: float) -> None:
    if quota == Quota():
        conn.execute("DELETE FROM quotas WHERE namespace = ?", (namespace,))
        return
    resources = json.dumps({k: str(v) for k, v in sorted(quota.resources.items())})
    conn.execute(
        "INSERT INTO quotas (namespace, weight, max_running, resources, max_runtime, default_runtime, "
        "updated_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (namespace) DO UPDATE SET "
        "weight = excluded.weight, max_running = excluded.max_running, resources = excluded.resources, "
        "max_runtime = excluded.max_runtime, default_runtime = excluded.default_runtime, "
        "updated_at = excluded.updated_at",
        (
            namespace,
            str(quota.weight),
            quota.max_running,
            resources,
            quota.max_runtime,
            quota.default_runtime,
            now,
        ),
    )
