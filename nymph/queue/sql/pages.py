"""Paged lists in SQL (synchronous, inside the caller's read transaction): each page is one
index range read in a stable order, strictly after the key where the previous page ended, with
``LIMIT limit + 1`` (the extra row only says that more follow). See :mod:`nymph.queue.paging`.

| list | order (the key) | index |
|---|---|---|
| a provider's instances | ``(launched_at, instance_id)`` | ``instances_page``, ``instances_page_state`` with ``state`` |
| secrets, providers, modes | ``name`` | their primary key ``(namespace, name)`` |
| daemons | ``(node, daemon_id)`` | ``daemons_page`` |
"""

from __future__ import annotations

import json
from typing import Any

from nymph.protocol import DaemonJSON, InstanceJSON, iso
from nymph.queue.paging import Key, Page, PageRequest, page_of
from nymph.queue.sql.dialect import Conn, Row
from nymph.queue.sql.rows import INSTANCE_COLUMNS, instances_json


def _after(columns: str, after: Key | None, params: list[Any]) -> str:
    if after is None:
        return ""
    params.extend(after)
    return f" AND ({columns}) > ({','.join('?' * len(after))})"


def instance_query(*, ns: str, provider: str, state: str | None, page: PageRequest) -> tuple[str, list[Any]]:
    """The SQL of one page of a provider's instances and its parameters (an index range of
    ``instances_page``, or of ``instances_page_state`` with a state)."""
    sql = f"SELECT {INSTANCE_COLUMNS} FROM instances WHERE namespace = ? AND provider = ?"  # noqa: S608
    params: list[Any] = [ns, provider]
    if state is not None:
        sql += " AND state = ?"
        params.append(state)
    sql += _after("launched_at, instance_id", page.after, params)
    params.append(page.limit + 1)
    return sql + " ORDER BY launched_at, instance_id LIMIT ?", params


def instance_rows(conn: Conn, *, ns: str, provider: str, state: str | None, page: PageRequest) -> Page[Row]:
    """One page of a provider's instance rows in creation order (of one state when given)."""
    sql, params = instance_query(ns=ns, provider=provider, state=state, page=page)
    rows = conn.execute(sql, params).fetchall()
    return page_of(rows, limit=page.limit, key_of=lambda r: (float(r["launched_at"]), str(r["instance_id"])))


def instances(
    conn: Conn, *, ns: str, provider: str, state: str | None, page: PageRequest
) -> Page[InstanceJSON]:
    rows = instance_rows(conn, ns=ns, provider=provider, state=state, page=page)
    return Page(items=instances_json(conn, rows.items), next_key=rows.next_key)


def _by_name(conn: Conn, *, table: str, columns: str, ns: str, page: PageRequest) -> Page[Row]:
    params: list[Any] = [ns]
    sql = f"SELECT {columns} FROM {table} WHERE namespace = ?"  # noqa: S608 - fixed names
    sql += _after("name", page.after, params)
    params.append(page.limit + 1)
    rows = conn.execute(sql + " ORDER BY name LIMIT ?", params).fetchall()
    return page_of(rows, limit=page.limit, key_of=lambda r: (str(r["name"]),))


def secrets(conn: Conn, *, ns: str, page: PageRequest) -> Page[dict[str, str]]:
    """Names and dates only, by name."""
    rows = _by_name(conn, table="secrets", columns="name, created_at, updated_at", ns=ns, page=page)
    items = [
        {"name": r["name"], "createdAt": iso(r["created_at"]), "updatedAt": iso(r["updated_at"])}
        for r in rows.items
    ]
    return Page(items=items, next_key=rows.next_key)


def providers(conn: Conn, *, ns: str, page: PageRequest) -> Page[dict[str, Any]]:
    rows = _by_name(conn, table="providers", columns="name, body", ns=ns, page=page)
    return Page(items=[json.loads(r["body"]) for r in rows.items], next_key=rows.next_key)


def modes(conn: Conn, *, ns: str, page: PageRequest) -> Page[dict[str, Any]]:
    rows = _by_name(conn, table="modes", columns="name, body", ns=ns, page=page)
    return Page(items=[json.loads(r["body"]) for r in rows.items], next_key=rows.next_key)


def daemons(conn: Conn, *, visible_to: str | None, page: PageRequest) -> Page[DaemonJSON]:
    """Every daemon that claimed, by node; for a token scoped to namespace ``visible_to``, only
    those serving a kube namespace of that name, showing that namespace alone (a page may then
    hold fewer than ``limit``: the key is that of the last row read)."""
    params: list[Any] = []
    sql = "SELECT daemon_id, node, namespaces, capacity, last_seen FROM daemons WHERE 1 = 1"
    sql += _after("node, daemon_id", page.after, params)
    params.append(page.limit + 1)
    rows = conn.execute(sql + " ORDER BY node, daemon_id LIMIT ?", params).fetchall()
    read = page_of(rows, limit=page.limit, key_of=lambda r: (str(r["node"]), str(r["daemon_id"])))
    out: list[DaemonJSON] = []
    for r in read.items:
        namespaces: list[str] = json.loads(r["namespaces"])
        if visible_to is not None:
            if visible_to not in namespaces:
                continue
            namespaces = [visible_to]
        out.append(
            DaemonJSON(
                daemonId=r["daemon_id"],
                node=r["node"],
                namespaces=namespaces,
                lastSeen=iso(r["last_seen"]),
                capacity=r["capacity"],
            )
        )
    return Page(items=out, next_key=read.next_key)
