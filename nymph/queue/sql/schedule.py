"""The inputs of a scheduling decision, read in SQL (synchronous, inside the caller's
transaction), and the plan of one claim. The decision itself is :mod:`nymph.queue.scheduling`.

Claimable launches are indexed by *group*: ``<kube namespace>/<namespace>/<shape>``, where the
shape is a digest of the launch's placement needs (node selector, tolerations, requests, nodes
to avoid), which repeat (most launches share a few modes). A claim reads the head of each
group (highest priority, then oldest) with one index seek per group, never the rows behind a
head, so the cost of a claim grows with the number of groups, not with the backlog: a launch
no live daemon can run holds back only the launches of its own group, never one behind it
that some daemon can run.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from nymph.launch.placement import Needs, NodeOffer, add, misfit
from nymph.protocol import FINISHED_STATUSES, TaskKind
from nymph.queue.offers import offer_of
from nymph.queue.scheduling import SLOTS, Candidate, Usage, charge, decayed, pick_next
from nymph.queue.sql.dialect import NAMESPACE_KEYS, Conn, indexed_by, lock_key, locks_rows
from nymph.queue.sql.quotas import all_quotas

#: A daemon that claimed within this many seconds counts as live (see sql.placement).
LIVE_SECONDS = 150.0
_FINISHED_SQL = ",".join(f"'{s}'" for s in FINISHED_STATUSES)
#: Above every kube namespace name (DNS labels: a-z, 0-9, '-') in bytewise order.
_TOP = "~"
_GROUPS = """
WITH RECURSIVE g(grp) AS (
    SELECT (SELECT MIN(grp) FROM tasks{hint} WHERE status = 'pending' AND grp > ? AND grp < ?)
    UNION ALL
    SELECT (SELECT MIN(t.grp) FROM tasks t{hint} WHERE t.status = 'pending' AND t.grp > g.grp AND t.grp < ?)
    FROM g WHERE g.grp IS NOT NULL
)
SELECT grp FROM g WHERE grp IS NOT NULL
"""
#: The claimable head of one group after ``(priority, seq)`` (the first call passes a key
#: above every task). A task after another (a moved launch after its stop) waits for it.
_HEAD = f"""
SELECT t.seq, t.grp, t.kind, t.namespace, t.priority, t.created_at, t.instance_id,
       (SELECT i.charge FROM instances i WHERE i.instance_id = t.instance_id) AS charge
FROM tasks t{{hint}}
WHERE t.status = 'pending' AND t.grp = ? AND t.not_before <= ?
  AND (t.priority < ? OR (t.priority = ? AND t.seq > ?))
  AND (t.after_task IS NULL OR EXISTS (
        SELECT 1 FROM tasks a WHERE a.task_id = t.after_task AND a.status IN ({_FINISHED_SQL})))
ORDER BY t.priority DESC, t.seq
LIMIT 1
"""  # noqa: S608 - constant fragments only
_ABOVE_ALL = (10**9, 10**9, -1)


def shape_of(kind: str, spec: Mapping[str, Any] | None) -> str:
    """The digest of what a launch needs of its node (equal needs, equal shape)."""
    if kind == TaskKind.DOCKYARD.value:
        return "dockyard"
    spec = spec or {}
    needs = {k: spec.get(k) for k in ("nodeSelector", "tolerations", "resources", "avoidNodes")}
    text = json.dumps(needs, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def group_of(*, kind: str, namespace: str, kube_namespace: str, spec: Mapping[str, Any] | None) -> str | None:
    """The group a new task is queued in, or None for one the scheduler does not order (stops
    and probes are handed out first, in order)."""
    if kind not in (TaskKind.LAUNCH.value, TaskKind.DOCKYARD.value):
        return None
    return f"{kube_namespace}/{namespace}/{shape_of(kind, spec)}"


def priority_of(spec: Mapping[str, Any] | None) -> int:
    value = (spec or {}).get("priority", 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclass(frozen=True)
class Head:
    """The next task of one group, as a scheduling candidate with what the node check needs."""

    grp: str
    kind: str
    instance_id: str | None
    needs: Needs
    candidate: Candidate


#: Placement needs by group: a group's shape is the digest of its needs, so they never change.
_NEEDS: dict[str, Needs] = {}
_NEEDS_MAX = 4096


def needs_of(conn: Conn, grp: str, seq: int) -> Needs:
    """The placement needs of a group (read from one of its tasks once, then remembered)."""
    hit = _NEEDS.get(grp)
    if hit is not None:
        return hit
    row = conn.execute("SELECT spec FROM tasks WHERE seq = ?", (seq,)).fetchone()
    try:
        spec = json.loads(row[0]) if row is not None and row[0] else None
    except ValueError:
        spec = None
    needs = Needs.from_spec(spec if isinstance(spec, Mapping) else None)
    if len(_NEEDS) >= _NEEDS_MAX:
        _NEEDS.clear()
    _NEEDS[grp] = needs
    return needs


def _head(conn: Conn, grp: str, *, now: float, after: tuple[int, int, int] = _ABOVE_ALL) -> Head | None:
    priority, same, seq = after
    row = conn.execute(
        _HEAD.format(hint=indexed_by(conn, "tasks_queue")), (grp, now, priority, same, seq)
    ).fetchone()
    if row is None:
        return None
    needs = needs_of(conn, grp, int(row["seq"]))
    return Head(
        grp=grp,
        kind=row["kind"],
        instance_id=row["instance_id"],
        needs=needs,
        candidate=Candidate(
            seq=int(row["seq"]),
            namespace=row["namespace"],
            priority=int(row["priority"]),
            queued_at=float(row["created_at"]),
            requests=needs.requests,
            charged=row["charge"] is not None,
        ),
    )


def groups(conn: Conn, *, kube_namespaces: Sequence[str]) -> list[str]:
    """Every group with a pending task, in the given kube namespaces (empty: all)."""
    ranges = [(f"{k}/", f"{k}0") for k in sorted(set(kube_namespaces))] or [("", _TOP)]
    out: list[str] = []
    for lo, hi in ranges:
        sql = _GROUPS.format(hint=indexed_by(conn, "tasks_queue"))
        out.extend(str(r[0]) for r in conn.execute(sql, (lo, hi, hi)))
    return out


def heads(conn: Conn, *, kube_namespaces: Sequence[str], scope: str | None, now: float) -> list[Head]:
    """The claimable head of every group a daemon serving ``kube_namespaces`` with a token
    scoped to ``scope`` may take."""
    out = []
    for grp in groups(conn, kube_namespaces=kube_namespaces):
        if scope is not None and grp.split("/", 2)[1] != scope:
            continue
        head = _head(conn, grp, now=now)
        if head is not None:
            out.append(head)
    return out


def usage(conn: Conn) -> dict[str, Usage]:
    """What each namespace's running launches hold (those counted since their lease or Pod)."""
    out: dict[str, Usage] = {}
    for r in conn.execute(
        "SELECT namespace, charge, COUNT(*) FROM instances WHERE charge IS NOT NULL GROUP BY namespace, charge"
    ):
        requests = _charge_requests(r[1])
        cur = out.get(r[0], Usage())
        count = int(r[2])
        out[r[0]] = Usage(
            running=cur.running + count,
            requests=add(cur.requests, {k: v * count for k, v in requests.items()}),
        )
    return out


def charge_text(requests: Mapping[str, Fraction]) -> str:
    return json.dumps({k: str(v) for k, v in sorted(requests.items())}, separators=(",", ":"))


def _charge_requests(text: str | None) -> dict[str, Fraction]:
    try:
        data = json.loads(text) if text else {}
        return {str(k): Fraction(str(v)) for k, v in data.items()} if isinstance(data, dict) else {}
    except (ValueError, ZeroDivisionError):
        return {}


#: The summed allocatable of the last few sets of live nodes (key: each node's offer text):
#: with a thousand daemons, adding their offers up on every claim would cost more than the claim.
_ALLOCATABLE: dict[tuple[tuple[str, str], ...], dict[str, Fraction]] = {}
_ALLOCATABLE_MAX = 8


def _allocatable(conn: Conn, *, now: float) -> dict[str, Fraction]:
    """The live daemons' nodes' allocatable, each node once (its first offer by node name)."""
    rows = tuple(
        (str(r["node"]), str(r["node_info"]))
        for r in conn.execute(
            "SELECT DISTINCT node, node_info FROM daemons WHERE last_seen > ? AND node_info IS NOT NULL "
            "ORDER BY node, node_info",
            (now - LIVE_SECONDS,),
        )
    )
    cached = _ALLOCATABLE.get(rows)
    if cached is not None:
        return cached
    out: dict[str, Fraction] = {}
    nodes: set[str] = set()
    for node, info in rows:
        offer = offer_of(info)
        if offer is not None and node not in nodes:
            nodes.add(node)
            out = add(out, offer.allocatable)
    if len(_ALLOCATABLE) >= _ALLOCATABLE_MAX:
        _ALLOCATABLE.clear()
    _ALLOCATABLE[rows] = out
    return out


def totals(conn: Conn, *, now: float, held: Mapping[str, Usage]) -> dict[str, Fraction]:
    """What the live daemons offer together: their nodes' allocatable (each node once) and their
    slots: the free capacity each sent with its last claim plus the launches running now (each
    holds one), so the total does not shrink as the daemons get busy."""
    free = conn.execute(
        "SELECT COALESCE(SUM(CASE WHEN capacity > 0 THEN capacity ELSE 0 END), 0) AS free "
        "FROM daemons WHERE last_seen > ?",
        (now - LIVE_SECONDS,),
    ).fetchone()["free"]
    slots = Fraction(sum(u.running for u in held.values()) + int(free or 0))
    return {**_allocatable(conn, now=now), SLOTS: slots}


def plan(
    conn: Conn,
    *,
    kube_namespaces: Sequence[str],
    scope: str | None,
    offer: NodeOffer | None,
    used_on_node: Callable[[], Mapping[str, Fraction]] | None,
    now: float,
    limit: int,
    only: frozenset[str] | None = None,
) -> list[Head]:
    """Up to ``limit`` tasks for a daemon, chosen one at a time by :func:`pick_next` among the
    group heads its node can run (with what it picked so far placed on it: ``used_on_node``,
    read only when a head requests a resource); ``only``: of these namespaces alone (those
    :func:`lock_namespaces` locked)."""
    if limit <= 0:
        return []
    pending = heads(conn, kube_namespaces=kube_namespaces, scope=scope, now=now)
    if only is not None:
        pending = [h for h in pending if h.candidate.namespace in only]
    if not pending:
        return []
    have_quotas = all_quotas(conn)
    held = usage(conn)
    # Shares decide only between namespaces: heads of one namespace need no totals (adding up a
    # thousand daemons' offers would cost more than the rest of the claim).
    several = len({h.candidate.namespace for h in pending}) > 1
    offered = totals(conn, now=now, held=held) if several else {}
    lately = recent(conn, now=now)
    # What is placed on the node, read at the first head that requests something (only such a
    # head can misfit for it; the picks before it requested nothing, so add nothing to it).
    on_node: dict[str, Fraction] | None = None

    def fits(needs: Needs, offer: NodeOffer) -> bool:
        nonlocal on_node
        if on_node is None and needs.requests_something:
            on_node = dict(used_on_node() if used_on_node is not None else {})
        return misfit(needs, offer, used=on_node) is None

    picked: list[Head] = []
    while pending and len(picked) < limit:
        by_seq = {
            h.candidate.seq: h
            for h in pending
            if offer is None or h.kind != TaskKind.LAUNCH.value or fits(h.needs, offer)
        }
        chosen = pick_next(
            [c.candidate for c in by_seq.values()],
            quotas=have_quotas,
            usage=held,
            totals=offered,
            recent=lately,
        )
        if chosen is None:
            break
        head = by_seq[chosen.seq]
        picked.append(head)
        held = charge(held, chosen)
        lately = {**lately, chosen.namespace: lately.get(chosen.namespace, 0.0) + 1.0}
        if head.kind == TaskKind.LAUNCH.value and on_node is not None:
            on_node = add(on_node, head.needs.requests)
        c = head.candidate
        following = _head(conn, head.grp, now=now, after=(c.priority, c.priority, c.seq))
        pending = [h for h in pending if h.grp != head.grp] + ([following] if following else [])
    return picked


def lock_namespaces(
    conn: Conn, *, kube_namespaces: Sequence[str], scope: str | None, now: float
) -> frozenset[str] | None:
    """In a PostgreSQL write, where replicas' claims run at once, serialise the claims that may
    hand out launches of the same namespaces (so two never both see room under one quota), in
    name order (no deadlock); claims of other namespaces do not wait. Returns the namespaces
    locked: the claim plans among them alone (a namespace whose first launch was queued after
    this read waits for the next claim). None on SQLite, whose writes run one at a time."""
    if not locks_rows(conn):
        return None
    names = sorted(
        {h.candidate.namespace for h in heads(conn, kube_namespaces=kube_namespaces, scope=scope, now=now)}
    )
    for name in names:
        lock_key(conn, NAMESPACE_KEYS, name)
    return frozenset(names)


def recent(conn: Conn, *, now: float) -> dict[str, float]:
    """How many launches each namespace was handed lately, faded to ``now``."""
    return {
        str(r["namespace"]): decayed(float(r["served"]), since=float(r["at"]), now=now)
        for r in conn.execute("SELECT namespace, served, at FROM recent_usage")
    }


def record_recent(conn: Conn, picked: Sequence[Head], *, now: float) -> None:
    """Add the picked launches to their namespaces' recent counts (faded to ``now`` first)."""
    counts: dict[str, int] = {}
    for head in picked:
        counts[head.candidate.namespace] = counts.get(head.candidate.namespace, 0) + 1
    if not counts:
        return
    lately = recent(conn, now=now)
    for namespace, count in sorted(counts.items()):
        conn.execute(
            "INSERT INTO recent_usage (namespace, served, at) VALUES (?, ?, ?) ON CONFLICT (namespace) "
            "DO UPDATE SET served = excluded.served, at = excluded.at",
            (namespace, lately.get(namespace, 0.0) + count, now),
        )


def mark_charged(conn: Conn, picked: Sequence[Head]) -> list[Head]:
    """Count each picked launch as running from now (until it is stopped); returns those still
    to hand out: a launch stopped (or asked to stop) since it was read is dropped, uncharged."""
    out = []
    for head in picked:
        if head.instance_id and not head.candidate.charged:
            cur = conn.execute(
                "UPDATE instances SET charge = ? WHERE instance_id = ? AND charge IS NULL "
                "AND state != 'stopped' AND stop_requested_at IS NULL",
                (charge_text(head.needs.requests), head.instance_id),
            )
            if not cur.rowcount:
                continue
        out.append(head)
    return out
