"""Why a queued launch is not running yet, worked out when it is read (synchronous SQL inside
the caller's read): never written per launch, so a backlog of 100,000 costs a claim nothing.

In order: no live daemon's node can run it (kept by the sweeper, see
:mod:`nymph.queue.sql.placement`), its namespace's quota holds it (``team-a at maxRunning 50
of 50``), or where it stands (``3rd of 40 in team-a``), with the namespaces served first
because they are below their share (``team-b is below its share``). The last two have a kind
(:data:`QUOTA`, :data:`SHARE`) that the sweeper puts in the event stream when it changes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from nymph.queue.scheduling import Quota, Usage, ordinal, quota_blocks, weighted_share
from nymph.queue.sql import schedule
from nymph.queue.sql.dialect import Conn, Row, indexed_by
from nymph.queue.sql.quotas import all_quotas

#: The kinds of the reasons worked out here (None: it waits its turn).
QUOTA, SHARE = "Quota", "FairShare"


@dataclass(frozen=True, slots=True)
class Standing:
    """Why a queued launch waits, as read now: the text and its kind."""

    text: str
    kind: str | None


#: Above this many queued launches read at once, positions come from one ranked read of each
#: namespace's queue instead of one count per launch.
_RANK_ALL = 20

#: The instances' tasks, by instance (the pending, grouped ones are kept in Python: with
#: ``status`` in the WHERE, SQLite reads every pending task through ``tasks_open`` instead).
_TASKS_OF = (
    "SELECT t.instance_id, t.seq, t.priority, t.grp, t.status FROM tasks t WHERE t.instance_id IN ({marks})"
)
_AHEAD = (
    "SELECT COUNT(*) FROM tasks{hint} WHERE status = 'pending' AND grp IS NOT NULL AND namespace = ? "
    "AND (priority > ? OR (priority = ? AND seq < ?))"
)
_QUEUED_IN = "SELECT COUNT(*) FROM tasks{hint} WHERE status = 'pending' AND grp IS NOT NULL AND namespace = ?"
_RANKED = (
    "SELECT seq FROM tasks{hint} WHERE status = 'pending' AND grp IS NOT NULL AND namespace = ? "
    "ORDER BY priority DESC, seq LIMIT ?"
)


def _hint(conn: Conn) -> str:
    return indexed_by(conn, "tasks_pending_ns")


#: The first ranked read's length; each further one reads four times as far (so the rows read
#: stay within a small multiple of the furthest position asked for, not the whole backlog).
_RANK_FIRST = 1024


def _below_share(
    conn: Conn,
    namespace: str,
    *,
    quotas: Mapping[str, Quota],
    usage: Mapping[str, Usage],
    totals: Callable[[], Mapping[str, Fraction]],
    groups: list[list[str]],
) -> list[str]:
    """The other namespaces with queued launches whose share is below this one's (served first).
    ``groups``: every queued group, read once (into the empty list); ``totals`` is asked for only
    when another namespace has queued launches (adding up every live daemon's offer is the costly
    part with many daemons)."""
    if not groups:
        groups.append(schedule.groups(conn, kube_namespaces=()))
    others = sorted({grp.split("/", 2)[1] for grp in groups[0]} - {namespace})
    if not others:
        return []
    offered = totals()
    mine = weighted_share(usage.get(namespace, Usage()), quotas.get(namespace, Quota()), offered)
    if mine <= 0:
        return []  # no share is below zero
    return [
        other
        for other in others
        if weighted_share(usage.get(other, Usage()), quotas.get(other, Quota()), offered) < mine
    ]


def _ranks(conn: Conn, namespace: str, wanted: set[int]) -> dict[int, int]:
    """The place (0: first) in ``namespace``'s queue of each queued task in ``wanted``, read
    from the head of the queue only as far as the furthest of them."""
    limit = _RANK_FIRST
    while True:
        seqs = [int(r[0]) for r in conn.execute(_RANKED.format(hint=_hint(conn)), (namespace, limit))]
        ranks = {seq: i for i, seq in enumerate(seqs)}
        if len(seqs) < limit or wanted <= ranks.keys():
            return ranks
        limit *= 4


def reasons(conn: Conn, rows: Sequence[Row], *, now: float) -> dict[str, str]:
    """The waiting reason of each queued instance in ``rows`` that has a launch in the queue."""
    return {iid: s.text for iid, s in standing(conn, rows, now=now).items()}


def standing(conn: Conn, rows: Sequence[Row], *, now: float, ranked: bool = True) -> dict[str, Standing]:
    """The waiting reason and its kind of each queued instance in ``rows`` (with ``instance_id``,
    ``namespace``, ``state`` and ``waiting``) that has a launch in the queue and no stored reason.
    ``ranked=False``: the kinds alone (each text empty), without counting what is ahead of each
    launch (what the sweeper needs to tell a change of kind, for hundreds of launches at once)."""
    queued = [r for r in rows if r["state"] == "queued" and not r["waiting"]]
    if not queued:
        return {}
    pending: dict[str, Row] = {}
    ids = [r["instance_id"] for r in queued]
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        sql = _TASKS_OF.format(marks=",".join("?" * len(chunk)))
        for t in conn.execute(sql, chunk):
            if t["status"] == "pending" and t["grp"] is not None:
                pending[t["instance_id"]] = t
    if not pending:
        return {}
    quotas = all_quotas(conn)
    usage = schedule.usage(conn)
    offered: list[Mapping[str, Fraction]] = []

    def totals() -> Mapping[str, Fraction]:
        if not offered:
            offered.append(schedule.totals(conn, now=now, held=usage))
        return offered[0]

    namespaces = {r["instance_id"]: r["namespace"] for r in queued}
    sizes: dict[str, int] = {}
    ranks: dict[str, dict[int, int]] = {}
    below: dict[str, list[str]] = {}
    groups: list[list[str]] = []
    out: dict[str, Standing] = {}
    for instance_id, t in pending.items():
        ns = namespaces[instance_id]
        text = ""
        if ranked:
            if ns not in sizes:
                sizes[ns] = int(conn.execute(_QUEUED_IN.format(hint=_hint(conn)), (ns,)).fetchone()[0])
            if len(pending) > _RANK_ALL:
                if ns not in ranks:
                    wanted = {int(p["seq"]) for i, p in pending.items() if namespaces[i] == ns}
                    ranks[ns] = _ranks(conn, ns, wanted)
                ahead = ranks[ns].get(int(t["seq"]), 0)
            else:
                p, seq = int(t["priority"]), int(t["seq"])
                ahead = int(conn.execute(_AHEAD.format(hint=_hint(conn)), (ns, p, p, seq)).fetchone()[0])
            text = f"{ordinal(ahead + 1)} of {sizes[ns]} in {ns}"
        kind: str | None = None
        quota = quotas.get(ns, Quota())
        # a launch's requests matter only to a quota on resources (read once per group)
        requests = schedule.needs_of(conn, t["grp"], int(t["seq"])).requests if quota.resources else {}
        blocked = quota_blocks(ns, quota, usage.get(ns, Usage()), requests)
        if blocked is not None:
            text, kind = f"{blocked}; {text}", QUOTA
        else:
            if ns not in below:
                below[ns] = _below_share(conn, ns, quotas=quotas, usage=usage, totals=totals, groups=groups)
            if below[ns]:
                others = ", ".join(below[ns][:3]) + (" and others" if len(below[ns]) > 3 else "")
                verb = "is" if len(below[ns]) == 1 else "are"
                text = f"{text}; {others} {verb} below {'its' if verb == 'is' else 'their'} share"
                kind = SHARE
        out[instance_id] = Standing(text, kind)
    return out
