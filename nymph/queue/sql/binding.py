"""Which daemon session may write an instance: its state reports, log chunks, log tail and
result files (synchronous SQL inside the caller's transaction).

An instance outside a session's kube namespaces or token scope is invisible to it
(:func:`nymph.queue.sql.rows.session_may_act`). Within them, a session writes an instance only

* while it holds the lease of one of the instance's tasks: the launch it is applying, or a stop
  it is carrying out, whichever node took it (a stop goes to another node's daemon once it has
  waited ``stop_node_fallback``); a lease that expired and was claimed again belongs to its new
  holder, and the old one writes no more through it. A launch whose lease was handed back
  (the daemon's session was replaced, the lease expired, a failure was requeued) stays its last
  holder's until another daemon claims it: the Pod it applied may exist, and a replaced
  daemon's first call may be a report replayed from its outbox. The lease of a Pod launch is
  its node's (the daemon that claims it pins the Pod there): a daemon restarted on that node
  under a new id adopts the Pod its predecessor applied before the launch was completed; or
* as the daemon that applied it, recorded with the instance when its launch completed
  (:func:`record_applied`). A Pod is pinned to that daemon's node (required node affinity, a
  hostPath workdir there), and the daemon of that node watches, follows and reaps it: any
  session registered on that node writes it, so a restarted daemon (a new session, a new
  process id in its default daemon id) reconciles and reports the Pods it adopts, and its
  outbox replays what the daemon before it did not send. An instance with no node (a dockyard
  launch, whose objects are not pinned, or one applied by a daemon that knows no node) is
  bound to the daemon id that applied it, on the same node: a replaced session of that daemon
  (same id, same node, see :mod:`nymph.queue.sessions`) inherits it.

Anything else (another node's daemon, a session registered for every namespace, a daemon
writing a direct launch or one never applied) is :class:`NotInstanceDaemon`, answered 403
with nothing written.
"""

from __future__ import annotations

from nymph.queue.errors import NotInstanceDaemon
from nymph.queue.models import DaemonSession
from nymph.queue.sql.dialect import Conn, Row


def record_applied(conn: Conn, *, instance_id: str, session: DaemonSession, pinned: bool) -> None:
    """Bind the instance to the session that completed its launch (``pinned``: a Pod on the
    session's node)."""
    conn.execute(
        "UPDATE instances SET applied_session = ?, applied_daemon = ?, applied_node = ?, "
        "applied_pinned = ? WHERE instance_id = ?",
        (
            session.session_id,
            session.daemon_id,
            session.node,
            int(pinned and bool(session.node)),
            instance_id,
        ),
    )


def record_ended(conn: Conn, *, instance_id: str, session: DaemonSession) -> None:
    """Bind an instance that no completed launch bound to the session that reported it stopped
    (a writer of it: the holder, or its node's daemon, of a launch whose completion was lost),
    so the last of its log and its result files are still taken once the launch is settled."""
    pod = conn.execute(
        "SELECT 1 FROM tasks WHERE instance_id = ? AND kind = 'launch' LIMIT 1", (instance_id,)
    ).fetchone()
    record_applied(conn, instance_id=instance_id, session=session, pinned=pod is not None)


_HOLDER = """
SELECT 1 FROM tasks t WHERE t.instance_id = :iid AND (
    (t.status = 'leased' AND t.lease_owner = :daemon)
    OR (t.status = 'pending' AND t.kind IN ('launch', 'dockyard') AND t.last_owner = :daemon)
    OR (:node != '' AND t.kind = 'launch' AND EXISTS (
        SELECT 1 FROM daemons d WHERE d.node = :node AND d.daemon_id = CASE t.status
            WHEN 'leased' THEN t.lease_owner WHEN 'pending' THEN t.last_owner END))
) LIMIT 1
"""


def holds_lease(conn: Conn, *, session: DaemonSession, instance_id: str) -> bool:
    """Whether the session's daemon holds the lease of a task of the instance, or held the
    lease of its launch last and nobody has claimed it since (handed back when its session was
    replaced, expired, or requeued after a failure: a Pod it applied may exist). For a Pod
    launch the holder is its node's daemon, whatever its id: the Pod is pinned to the node of
    the daemon that claims it, and a daemon restarted there adopts it before the launch
    completes."""
    row = conn.execute(
        _HOLDER, {"iid": instance_id, "daemon": session.daemon_id, "node": session.node}
    ).fetchone()
    return row is not None


def applied_by(session: DaemonSession, inst: Row) -> bool:
    """Whether the session is (or inherits from) the daemon that applied the instance."""
    daemon = inst["applied_daemon"]
    if daemon is None:
        return False
    node = inst["applied_node"] or ""
    if inst["applied_pinned"]:
        return bool(node) and session.node == node
    return session.daemon_id == daemon and session.node == node


def may_write(conn: Conn, *, session: DaemonSession, inst: Row) -> bool:
    return applied_by(session, inst) or holds_lease(conn, session=session, instance_id=inst["instance_id"])


def check_writer(conn: Conn, *, session: DaemonSession, inst: Row, action: str) -> None:
    """Raise :class:`NotInstanceDaemon` unless the session may write the instance (``action``:
    what it sent, for the message and the log)."""
    if not may_write(conn, session=session, inst=inst):
        raise refusal(session=session, instance_id=inst["instance_id"], action=action)


def refusal(*, session: DaemonSession, instance_id: str, action: str) -> NotInstanceDaemon:
    return NotInstanceDaemon(
        f"daemon {session.daemon_id!r} on node {session.node or '(none)'!r} may not send {action} "
        f"for instance {instance_id!r}: it holds no lease of its tasks and did not apply it; only "
        "the daemon that runs an instance writes it (nothing was stored)",
        instance_id=instance_id,
        action=action,
    )
