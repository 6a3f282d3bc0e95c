"""What daemons send back besides completions: state reports, logs, and the list of instances a
node should be running (synchronous SQL inside one transaction on the database thread)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nymph.launch.state import InstanceState, Reason
from nymph.protocol import ActiveJSON
from nymph.queue.errors import NotFound
from nymph.queue.models import DaemonSession, Report
from nymph.queue.sql import binding, placement
from nymph.queue.sql.dialect import Conn, Row, for_update, locks_rows
from nymph.queue.sql.rows import fetch_instance, lock_instance, session_filter, session_may_act
from nymph.queue.sql.transitions import record_termination, transition


def stream_key(*, daemon_id: str, stream: str) -> str:
    """Report stream marks are kept per daemon: one daemon's stream can never move another's."""
    return f"{daemon_id}\x00{stream}"


def report(
    conn: Conn,
    *,
    session: DaemonSession,
    stream: str,
    reports: Sequence[Report],
    now: float,
) -> tuple[int, int, set[str]]:
    """Apply reports with seq above the mark of the session daemon's stream, in the order given;
    reports on instances outside the session's namespaces count but change nothing. A report on
    an instance the session may not write (:mod:`nymph.queue.sql.binding`) refuses the whole
    batch with :class:`NotInstanceDaemon`: the transaction rolls back, nothing of it is written
    and the stream's mark stays. One from a node the instance was moved off counts and changes
    nothing, as before the move.

    Returns (accepted, last_seq, changed instance ids); ``last_seq`` is -1 for a new stream.
    """
    stream = stream_key(daemon_id=session.daemon_id, stream=stream)
    row = _stream_mark(conn, stream=stream, now=now)
    last = -1 if row is None else int(row[0])
    accepted = 0
    changed: set[str] = set()
    for r in reports:
        if r.seq <= last:
            continue
        last = r.seq
        accepted += 1
        inst = fetch_instance(conn, r.instance_id)
        if inst is None or not session_may_act(session, inst):
            continue
        if not binding.may_write(conn, session=session, inst=inst):
            if placement.moved_off(conn, instance_id=r.instance_id, node=session.node):
                continue  # moved off this node: what its old daemon says no longer counts
            # The whole batch is refused (the transaction rolls back: nothing is written).
            raise binding.refusal(session=session, instance_id=r.instance_id, action="a state report")
        terminated = r.termination is not None and record_termination(
            conn, instance_id=r.instance_id, termination=r.termination
        )
        if terminated:
            changed.add(r.instance_id)
        if inst["stop_requested_at"] is not None and r.state not in (
            InstanceState.STOPPING.value,
            InstanceState.STOPPED.value,
        ):
            continue  # a stop was asked for: a late "starting"/"running" must not undo it
        if placement.moved_off(conn, instance_id=r.instance_id, node=session.node):
            continue  # moved to another node: the Pod being removed here no longer counts
        if r.reason == Reason.UNSCHEDULABLE.value and placement.move_off(
            conn,
            instance=inst,
            daemon_id=session.daemon_id,
            node=session.node,
            message=r.message or "",
            now=now,
        ):
            changed.add(r.instance_id)
            continue
        reason, message = stop_reason(r, stop_requested=inst["stop_requested_at"] is not None)
        if transition(
            conn,
            instance_id=r.instance_id,
            now=now,
            state=r.state,
            reason=reason,
            message=message,
            node=r.node,
            at=r.at,
            row=None if terminated else inst,  # read again only if the exit code changed it
        ):
            changed.add(r.instance_id)
            if r.state == InstanceState.STOPPED.value and inst["applied_daemon"] is None:
                # It ended before its launch was completed (that completion was lost, and the
                # launch is settled without one): its daemon still sends the last of its log
                # and its result files.
                binding.record_ended(conn, instance_id=r.instance_id, session=session)
    if accepted:
        conn.execute(
            "INSERT INTO report_streams (stream, last_seq, updated_at) VALUES (?, ?, ?) "
            "ON CONFLICT (stream) DO UPDATE SET last_seq = excluded.last_seq, "
            "updated_at = excluded.updated_at",
            (stream, last, now),
        )
    return accepted, last, changed


def _stream_mark(conn: Conn, *, stream: str, now: float) -> Row | None:
    """The stream's mark (None for a new stream). In a PostgreSQL write the stream's row is
    made to exist (with no mark yet, rolled back with a refused batch) and locked, so two
    batches of one stream, on any replicas, are applied one after the other, in order."""
    if locks_rows(conn):
        conn.execute(
            "INSERT INTO report_streams (stream, last_seq, updated_at) VALUES (?, -1, ?) "
            "ON CONFLICT (stream) DO NOTHING",
            (stream, now),
        )
    row: Row | None = conn.execute(
        "SELECT last_seq FROM report_streams WHERE stream = ?" + for_update(conn, key=False),  # noqa: S608 - a constant
        (stream,),
    ).fetchone()
    return row


def stop_reason(r: Report, *, stop_requested: bool) -> tuple[str | None, str]:
    """The reason and message a report is recorded with. A Pod found gone (``Deleted``) after the
    user asked for a stop ended on request: the daemon that deleted it may have died before it
    could say so, and the one after it only finds the Pod missing."""
    message = r.message or ""
    if stop_requested and r.state == InstanceState.STOPPED.value and r.reason == Reason.DELETED.value:
        return Reason.STOPPED.value, f"stopped on request ({message})" if message else "stopped on request"
    return r.reason, message


def store_logs(
    conn: Conn,
    *,
    session: DaemonSession,
    instance_id: str,
    logs: str,
    max_bytes: int,
    now: float,
) -> None:
    inst = fetch_instance(conn, instance_id)
    if inst is None or not session_may_act(session, inst):
        raise NotFound(
            f"no instance {instance_id!r}: upload logs only for instances you run", code="instance_not_found"
        )
    binding.check_writer(conn, session=session, inst=inst, action="a log tail")
    keep_log_tail(conn, instance_id=instance_id, logs=logs, max_bytes=max_bytes, now=now)


def keep_log_tail(conn: Conn, *, instance_id: str, logs: str, max_bytes: int, now: float) -> None:
    """Store the last ``max_bytes`` of an instance's log (the queue's own, unscoped write)."""
    lock_instance(conn, instance_id)
    data = logs.encode("utf-8", errors="replace")
    if len(data) > max_bytes:
        dropped = len(data) - max_bytes
        marker = f"[nymph: first {dropped} bytes of the log dropped]\n".encode()
        data = marker + data[len(data) - max_bytes + len(marker) :]
    conn.execute(
        "INSERT INTO instance_logs (instance_id, text, updated_at) VALUES (?, ?, ?) "
        "ON CONFLICT (instance_id) DO UPDATE SET text = excluded.text, updated_at = excluded.updated_at",
        (instance_id, data.decode("utf-8", errors="ignore"), now),
    )


def active(conn: Conn, *, session: DaemonSession) -> list[ActiveJSON]:
    """The live instances on the session's node, within its namespaces: the Pods applied there,
    which the daemon of that node writes (:mod:`nymph.queue.sql.binding`)."""
    where, extra = session_filter(session)
    sql = (
        "SELECT instance_id, namespace, kube_namespace, state, node FROM instances "  # noqa: S608 - placeholders only
        "WHERE node = ? AND state != 'stopped' AND applied_pinned = 1 AND applied_node = node" + where
    )
    params: list[Any] = [session.node, *extra]
    return [
        ActiveJSON(
            instanceId=r["instance_id"],
            namespace=r["namespace"],
            kubeNamespace=r["kube_namespace"],
            state=r["state"],
            node=r["node"],
        )
        for r in conn.execute(sql + " ORDER BY launched_at", params)
    ]
