"""Node-aware claims in SQL (synchronous, inside the caller's transaction): what the queue has
placed on a node, which claimable launches a daemon's node can run, and why a queued launch
waits when no live daemon's node can run it. The matching itself is
:mod:`nymph.launch.placement` (pure)."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Mapping, Sequence
from fractions import Fraction
from types import MappingProxyType

from nymph.launch.placement import Needs, NodeOffer, add, misfit, waiting_kind, why_waiting
from nymph.launch.state import InstanceState
from nymph.queue.offers import offer_of
from nymph.queue.sql import events, waiting
from nymph.queue.sql.dialect import Conn, Row, indexed_by, send
from nymph.queue.sql.tasks import insert_task

#: A daemon that claimed within this many seconds counts as live for the waiting reason (a
#: claim long-polls up to a minute; its record is refreshed when the claim starts).
LIVE_SECONDS = 150.0
#: How many claimable tasks past the daemon's capacity a claim looks at to find ones it can run.
SCAN_EXTRA = 500
#: How many queued launches one sweep gives a waiting reason.
WAITING_BATCH = 500

#: The states of an instance not stopped, named so an index on the state can seek each.
_LIVE_STATES = ",".join(f"'{s.value}'" for s in InstanceState if s is not InstanceState.STOPPED)
#: Only an instance's latest launch task counts: a moved launch is counted where it went.
_LATEST = "t.seq = (SELECT MAX(l.seq) FROM tasks l WHERE l.instance_id = t.instance_id AND l.kind = 'launch')"
#: What is placed on nodes, in two disjoint parts (a task is done or leased, never both), each
#: read through an index from the few live rows (never through every task ever done): launches
#: applied on a node (by the node's instances not stopped) and launches leased to a node's
#: daemon (by the leased tasks). ``{node}``/``{daemon}``: the node filter of each part.
_PLACED = (
    "SELECT {cols} FROM instances i{by_node} JOIN tasks t{by_instance} ON t.instance_id = i.instance_id "  # noqa: S608 - constants
    f"WHERE i.state IN ({_LIVE_STATES}) AND {{node}} AND t.kind = 'launch' AND t.status = 'done' AND {_LATEST} "
    "UNION ALL "
    "SELECT {leased_cols} FROM tasks t{open} JOIN instances i ON i.instance_id = t.instance_id "
    f"JOIN daemons d ON d.daemon_id = t.lease_owner WHERE t.status = 'leased' AND t.kind = 'launch' "
    f"AND t.lease_expires > :now AND i.state IN ({_LIVE_STATES}) AND {{daemon}} AND {_LATEST}"
)


def _placed_sql(conn: Conn, *, one_node: bool) -> str:
    return _PLACED.format(
        cols="t.spec" if one_node else "i.node, t.spec",
        leased_cols="t.spec" if one_node else "d.node, t.spec",
        node="i.node = :node" if one_node else "i.node IS NOT NULL",
        daemon="d.node = :node" if one_node else "d.node IS NOT NULL AND d.node != ''",
        by_node=indexed_by(conn, "instances_by_node" if one_node else "instances_by_state_age"),
        by_instance=indexed_by(conn, "tasks_by_instance"),
        open=indexed_by(conn, "tasks_open"),
    )


def _parse_needs(spec_text: str | None) -> Needs:
    try:
        spec = json.loads(spec_text) if spec_text else None
    except ValueError:
        return Needs()
    return Needs.from_spec(spec if isinstance(spec, Mapping) else None)


class NeedsCache:
    """:class:`Needs` by the spec text they were parsed from. A claim adds up the requests of
    every launch placed on its node (hundreds on a busy node), and a task's spec never changes
    once written: each is parsed once, not at every claim. Keyed by the text's hash and length
    (the hash is keyed per process, so texts cannot be made to collide), never the text itself,
    so memory stays bounded (``size`` entries) whatever the size of the scripts; the oldest
    entries go first. Safe across the database threads."""

    def __init__(self, size: int = 16384) -> None:
        self.size = size
        self._by_key: dict[tuple[int, int], Needs] = {}
        self._lock = threading.Lock()

    def __call__(self, spec_text: str | None) -> Needs:
        if not spec_text:
            return Needs()
        key = (hash(spec_text), len(spec_text))
        hit = self._by_key.get(key)
        if hit is not None:
            return hit
        parsed = _parse_needs(spec_text)
        # shared by every caller from now on: read-only
        needs = dataclasses.replace(parsed, requests=MappingProxyType(dict(parsed.requests)))
        with self._lock:
            while len(self._by_key) >= self.size:
                self._by_key.pop(next(iter(self._by_key)))
            self._by_key[key] = needs
        return needs


_needs = NeedsCache()


def placed_on(conn: Conn, *, node: str, now: float) -> dict[str, Fraction]:
    """The requests of the launches the queue has on ``node``: applied there and not stopped, or
    leased to a daemon on it and not completed yet (only an instance's latest launch task counts:
    a moved launch is counted where it went)."""
    used: dict[str, Fraction] = {}
    for (spec,) in conn.execute(_placed_sql(conn, one_node=True), {"node": node, "now": now}):
        used = add(used, _needs(spec).requests)
    return used


def placed_by_node(conn: Conn, *, now: float) -> dict[str, dict[str, Fraction]]:
    """:func:`placed_on` of every node at once (one read, whatever the number of nodes); a node
    with nothing placed on it is absent."""
    out: dict[str, dict[str, Fraction]] = {}
    for node, spec in conn.execute(_placed_sql(conn, one_node=False), {"now": now}):
        out[node] = add(out.get(node, {}), _needs(spec).requests)
    return out


def pick(
    conn: Conn,
    rows: Sequence[Row],
    *,
    offer: NodeOffer | None,
    node: str,
    capacity: int,
    now: float,
) -> list[int]:
    """The seqs of the first ``capacity`` candidate rows (seq, kind, spec) the node can run: a
    launch must fit :func:`misfit` given what is placed there (including the ones picked now);
    other kinds are not placed. Without an offer every row fits."""
    if offer is None:
        return [r["seq"] for r in rows[:capacity]]
    # What is placed on the node counts only for a launch that requests something (misfit),
    # so it is read at the first such launch: a claim of launches that request nothing reads
    # nothing more (the picks before it requested nothing, so they add nothing to it).
    used: dict[str, Fraction] | None = None
    out: list[int] = []
    for r in rows:
        if len(out) >= capacity:
            break
        if r["kind"] != "launch":
            out.append(r["seq"])
            continue
        needs = _needs(r["spec"])
        if used is None and needs.requests_something:
            used = placed_on(conn, node=node, now=now)
        if misfit(needs, offer, used=used) is None:
            if used is not None:
                used = add(used, needs.requests)
            out.append(r["seq"])
    return out


def _live_offers(conn: Conn, *, now: float) -> list[tuple[str, tuple[str, ...], NodeOffer | None]]:
    out: list[tuple[str, tuple[str, ...], NodeOffer | None]] = []
    for r in conn.execute(
        "SELECT node, namespaces, node_info FROM daemons WHERE last_seen > ?", (now - LIVE_SECONDS,)
    ):
        out.append((r["node"], tuple(json.loads(r["namespaces"])), offer_of(r["node_info"])))
    return out


def update_waiting(conn: Conn, *, now: float) -> None:
    """Give each queued launch (the oldest ``WAITING_BATCH``) the reason no live daemon takes it,
    or clear it; and tell the event stream when the kind of a reason worked out at read time (its
    namespace's quota, its share) starts or stops applying to one of them. A daemon that sends
    no offer may take anything. The reasons are written and their events recorded together
    (:func:`_set_waiting`, :func:`nymph.queue.sql.events.record_each`): a few round trips
    whatever the number of launches given a reason, so a sweep that finds hundreds newly
    waiting ends as soon as one that finds none."""
    cleared = conn.execute(
        "SELECT instance_id, state FROM instances WHERE waiting IS NOT NULL AND instance_id NOT IN "
        "(SELECT instance_id FROM tasks WHERE kind = 'launch' AND status = 'pending' "
        "AND instance_id IS NOT NULL)"
    ).fetchall()
    if cleared:
        _set_waiting(conn, {None: [r["instance_id"] for r in cleared]})
        queued = [r["instance_id"] for r in cleared if r["state"] == "queued"]
        events.record_each(conn, instance_ids=queued, changes=[events.WAITING], at=now)
    rows = conn.execute(
        "SELECT t.kube_namespace, t.spec, i.instance_id, i.namespace, i.state, i.waiting, i.waiting_told "
        "FROM tasks t "
        "JOIN instances i ON i.instance_id = t.instance_id "
        "WHERE t.kind = 'launch' AND t.status = 'pending' AND i.state = 'queued' "
        "ORDER BY t.seq LIMIT ?",
        (WAITING_BATCH,),
    ).fetchall()
    if not rows:
        return
    judge = _Judge(conn, now=now)  # read only when a launch waits
    unplaced: list[Row] = []
    new_reasons: dict[str | None, list[str]] = {}
    kind_changed: list[str] = []
    for r in rows:
        reason = judge.reason(str(r["kube_namespace"]), r["spec"])
        if reason != r["waiting"]:
            new_reasons.setdefault(reason, []).append(r["instance_id"])
            if waiting_kind(reason) != waiting_kind(r["waiting"]):  # never for a mere change of figures
                kind_changed.append(r["instance_id"])
                continue
        if reason is None:
            unplaced.append(r)  # not waiting for a node: its quota or share may hold it
    _set_waiting(conn, new_reasons)
    events.record_each(conn, instance_ids=kind_changed, changes=[events.WAITING], at=now)
    told = {r["instance_id"]: r["waiting_told"] for r in rows}
    kinds = waiting.standing(conn, unplaced, now=now, ranked=False)  # no ranks: hundreds at once
    changed = [
        r
        for r in unplaced
        if r["instance_id"] in kinds and kinds[r["instance_id"]].kind != told[r["instance_id"]]
    ]
    standing = {
        instance_id: (now_standing.text, now_standing.kind)
        for instance_id, now_standing in waiting.standing(conn, changed, now=now).items()
        if now_standing.kind != told[instance_id]
    }
    events.record_each(conn, instance_ids=list(standing), changes=[events.WAITING], at=now, standing=standing)


class _Judge:
    """Why no live daemon takes a launch, for one sweep: the daemons' offers are read once (a
    thousand live daemons are a thousand rows to parse), what is placed on each node at the
    first offer needed, and each reason worked out once per kube namespace and needs (the
    offers do not change during a sweep; hundreds of waiting launches, each checked against a
    thousand offers, would be hundreds of thousands of checks)."""

    def __init__(self, conn: Conn, *, now: float) -> None:
        self.conn = conn
        self.now = now
        self.daemons = _live_offers(conn, now=now)
        self._used: dict[str, dict[str, Fraction]] | None = None
        self._offers: dict[str, list[tuple[NodeOffer, Mapping[str, Fraction]]] | None] = {}
        self._reasons: dict[tuple[str, tuple[object, ...]], str | None] = {}

    def reason(self, kube_ns: str, spec: str | None) -> str | None:
        """The launch's waiting reason; None when some live daemon serving ``kube_ns`` can
        take it."""
        offers = self._offers_in(kube_ns)
        if offers is None:
            return None
        needs = _needs(spec)
        key = (kube_ns, needs.key())
        if key not in self._reasons:
            self._reasons[key] = why_waiting(needs, offers)
        return self._reasons[key]

    def _offers_in(self, kube_ns: str) -> list[tuple[NodeOffer, Mapping[str, Fraction]]] | None:
        """The offers of the live daemons serving ``kube_ns``, each with what is placed on its
        node; None when one of them sends no offer (a daemon that sends none may take
        anything)."""
        if kube_ns in self._offers:
            return self._offers[kube_ns]
        offers: list[tuple[NodeOffer, Mapping[str, Fraction]]] = []
        for node, namespaces, offer in self.daemons:
            if namespaces and kube_ns not in namespaces:
                continue
            if offer is None or not node:
                self._offers[kube_ns] = None
                return None
            if self._used is None:
                self._used = placed_by_node(self.conn, now=self.now)
            offers.append((offer, self._used.get(node, {})))
        self._offers[kube_ns] = offers
        return offers


def _set_waiting(conn: Conn, reasons: Mapping[str | None, Sequence[str]]) -> None:
    """Store each reason (None: none) on its instances: one statement per reason and
    :data:`~nymph.queue.sql.events.EACH_CHUNK` instances, its result unread (sent with the next
    statement that reads, on PostgreSQL)."""
    for reason, ids in reasons.items():
        for start in range(0, len(ids), events.EACH_CHUNK):
            chunk = ids[start : start + events.EACH_CHUNK]
            marks = ",".join("?" * len(chunk))
            send(conn, f"UPDATE instances SET waiting = ? WHERE instance_id IN ({marks})", (reason, *chunk))  # noqa: S608


# --- moving a launch off a node where it turned out Unschedulable ----------------------------

#: How many times a launch is moved to another node after turning out Unschedulable.
MAX_MOVES = 3
_AVOID = "avoidNodes"


def _latest_launch(conn: Conn, instance_id: str) -> Row | None:
    row: Row | None = conn.execute(
        "SELECT * FROM tasks WHERE instance_id = ? AND kind = 'launch' ORDER BY seq DESC LIMIT 1",
        (instance_id,),
    ).fetchone()
    return row


def moved_off(conn: Conn, *, instance_id: str, node: str) -> bool:
    """True if the instance was moved off ``node`` (its reports from there no longer count)."""
    if not node:
        return False
    row = _latest_launch(conn, instance_id)
    return row is not None and node in _needs(row["spec"]).avoid


def move_off(
    conn: Conn,
    *,
    instance: Row,
    daemon_id: str,
    node: str,
    message: str,
    now: float,
) -> bool:
    """A daemon on ``node`` reports its launch Unschedulable: unless the launch was moved
    ``MAX_MOVES`` times already, queue a stop on that node (its Pod goes) and, after it, the same
    launch again, avoiding every node it was Unschedulable on. Returns True if it was moved."""
    launch = _latest_launch(conn, instance["instance_id"])
    if (
        not node
        or launch is None
        or _dispatch(conn, instance["instance_id"]) != "daemon"
        or instance["stop_requested_at"] is not None
        or instance["state"] == "stopped"
        or launch["lease_owner"] != daemon_id
        or launch["status"] not in ("done", "leased")
    ):
        return False
    moves = (
        conn.execute(
            "SELECT COUNT(*) FROM tasks WHERE instance_id = ? AND kind = 'launch'", (instance["instance_id"],)
        ).fetchone()[0]
        - 1
    )
    if moves >= MAX_MOVES:
        return False
    spec = json.loads(launch["spec"]) if launch["spec"] else {}
    spec[_AVOID] = sorted({*spec.get(_AVOID, ()), node})
    if launch["status"] == "leased":  # applied, completion still on its way: it is done
        conn.execute(
            "UPDATE tasks SET status = 'done', finished_at = ?, updated_at = ?, lease_expires = NULL "
            "WHERE seq = ? AND status = 'leased'",
            (now, now, launch["seq"]),
        )
    stop_id = _insert(conn, launch=launch, kind="stop", spec=None, after=None, grace=0, now=now)
    _insert(conn, launch=launch, kind="launch", spec=spec, after=stop_id, grace=None, now=now)
    text = (
        f"Unschedulable on node {node} ({message[:300] or 'no reason given'}); moving it to another "
        f"node (move {moves + 1} of {MAX_MOVES})"
    )
    conn.execute(
        "UPDATE instances SET state = 'queued', reason = 'Unschedulable', message = ?, "
        "node = ?, updated_at = ?, version = version + 1 WHERE instance_id = ?",
        (text, node, now, instance["instance_id"]),
    )
    conn.execute(
        "INSERT INTO instance_events (instance_id, state, reason, message, at) VALUES (?, ?, ?, ?, ?)",
        (instance["instance_id"], "queued", "Unschedulable", text, now),
    )
    changes = events.changes_between(
        (instance["state"], instance["reason"], instance["node"]), ("queued", "Unschedulable", node)
    )
    events.record(conn, instance_id=instance["instance_id"], changes=changes or [events.STATE], at=now)
    return True


def _dispatch(conn: Conn, instance_id: str) -> str | None:
    row = conn.execute("SELECT dispatch FROM instances WHERE instance_id = ?", (instance_id,)).fetchone()
    return None if row is None else str(row[0])


def is_move(conn: Conn, *, stop_task_id: str) -> bool:
    """True if this stop task clears a node for a moved launch (not a stop the user asked for)."""
    row = conn.execute(
        "SELECT 1 FROM tasks WHERE after_task = ? AND kind = 'launch' LIMIT 1", (stop_task_id,)
    ).fetchone()
    return row is not None


def _insert(
    conn: Conn,
    *,
    launch: Row,
    kind: str,
    spec: dict[str, object] | None,
    after: str | None,
    grace: int | None,
    now: float,
) -> str:
    return insert_task(
        conn,
        kind=kind,
        ns=launch["namespace"],
        kube_ns=launch["kube_namespace"],
        provider=launch["provider"],
        instance_id=launch["instance_id"],
        spec=spec,
        requester=launch["requester"],
        ts=now,
        after=after,
        grace=grace,
    )
