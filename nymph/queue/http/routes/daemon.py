"""Daemon routes (the dispatch API), for nymph daemons (the auth middleware checks).

A daemon registers with the shared bootstrap token and gets a session of its own (see
:mod:`nymph.queue.sessions`); with it, it claims tasks by long-poll, renews its leases while it
works, hands back what it did not start, completes tasks (one, or a batch, per call), streams
state reports, uploads logs before reaping, and asks which instances it should be running
after a restart. Each call acts as the session's daemon id, on its node, within the
namespaces it registered for; a ``daemonId`` / ``node`` in a body or query must match the
session (else 403). Reports, log tails (and the log chunks and result files of
:mod:`nymph.queue.http.routes.output` and :mod:`nymph.queue.http.routes.results`) are taken
only for instances the session's daemon runs (:mod:`nymph.queue.sql.binding`; else 403
``not_instance_daemon``, logged, nothing written).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import structlog
from aiohttp import web

from nymph.errors import ValidationError
from nymph.launch.names import check_namespace
from nymph.launch.state import InstanceState, Reason
from nymph.protocol import RenewAnswer, ReportAck, SessionJSON, iso, parse_iso
from nymph.queue.errors import BadRequest, Forbidden, ServiceError, Unprocessable
from nymph.queue.http.answers import json_response
from nymph.queue.http.bodies import Fields, read_object
from nymph.queue.http.caller import daemon_session
from nymph.queue.http.keys import METRICS, OFFERS, PRINCIPAL, SESSIONS, SETTINGS, STORE
from nymph.queue.http.routes.refusals import logged_refusal
from nymph.queue.models import ClaimRequest, ClaimResult, DaemonSession, Report, TaskCompletion
from nymph.queue.notify import hold_deadline, wait_for_event
from nymph.queue.offers import ParsedOffer
from nymph.queue.wakeup import claim_accepts

routes = web.RouteTableDef()
log = structlog.get_logger(__name__, component="queue.dispatch")

_STATES = frozenset(s.value for s in InstanceState)
_REASONS = frozenset(r.value for r in Reason)
_MAX_IDS = 1000
_MAX_COMPLETIONS = 500
_LATEST = 7_258_118_400.0  # 2200-01-01: report times must lie between 1970 and 2200


def _scope(request: web.Request) -> str | None:
    return request[PRINCIPAL].namespace


def _session(request: web.Request, f: Fields | None = None) -> DaemonSession:
    return daemon_session(request, f)


def _namespaces(f: Fields, key: str) -> tuple[str, ...]:
    namespaces = f.strings(key, required=False, max_items=1000)
    for i, ns in enumerate(namespaces):
        try:
            check_namespace(ns, field=f"body.{key}[{i}]")
        except ValidationError as exc:
            raise Unprocessable(str(exc)) from None
    return tuple(dict.fromkeys(namespaces))


@routes.post("/v1/dispatch/register")
async def register(request: web.Request) -> web.Response:
    """Bootstrap token in, session credential out (shown once)."""
    f = Fields(await read_object(request))
    f.reject_unknown({"daemonId", "node", "namespaces"})
    daemon_id = f.req_string("daemonId")
    node = f.string("node", required=False) or ""
    namespaces = _namespaces(f, "namespaces")
    registered = await request.app[SESSIONS].register(
        bootstrap=request[PRINCIPAL], daemon_id=daemon_id, node=node, namespaces=namespaces
    )
    if registered.replaced is not None:
        # A live session of this daemon id is replaced (a restart, or someone holding the
        # bootstrap token): its leases go back to the queue, never to the new session.
        released = await request.app[STORE].release_all(session=registered.replaced)
        log.warning(
            "daemon session replaced; its leases were handed back",
            daemon=daemon_id,
            node=node,
            replaced=registered.replaced.session_id,
            released=len(released),
        )
    log.info(
        "daemon registered",
        daemon=daemon_id,
        node=node,
        namespaces=list(namespaces),
        session=registered.session.session_id,
        bootstrap=request[PRINCIPAL].token_id,
    )
    return json_response(
        SessionJSON(
            sessionToken=registered.credential,
            daemonId=daemon_id,
            node=node,
            namespaces=list(namespaces),
            expiresAt=iso(registered.expires_at),
            ttlSeconds=request.app[SETTINGS].sessions.ttl_seconds,
        ),
        status=201,
    )


def _disconnected(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


def _node_info(request: web.Request, f: Fields) -> ParsedOffer | None:
    raw = f.mapping("nodeInfo")
    if raw is None:
        return None
    try:
        return request.app[OFFERS].parse(raw)
    except ValueError as exc:
        raise Unprocessable(f"body.nodeInfo: {str(exc)[:200]}") from None


@routes.post("/v1/dispatch/claim")
async def claim(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    store = request.app[STORE]
    f = Fields(await read_object(request))
    namespaces = _namespaces(f, "namespaces")
    f.string("daemonId", required=False)
    node = f.string("node", required=False)
    capacity = f.integer("capacity", minimum=0, maximum=1000)
    parsed = _node_info(request, f)
    session = _session(request, f)
    if node is not None and node != session.node:
        raise Forbidden(
            f"this session is for node {session.node!r}, not {node!r}: register on the node you run on",
            code="wrong_node",
        )
    outside = [ns for ns in namespaces if not session.serves(ns)]
    if outside:
        raise Forbidden(
            f"namespace {outside[0]!r} is not one this session registered for: register with "
            "every namespace the daemon serves",
            code="wrong_namespace",
        )
    req = ClaimRequest(
        daemon_id=session.daemon_id,
        # Empty when the daemon does not know its node (a local process without NODE_NAME).
        node=session.node,
        namespaces=namespaces or session.namespaces,
        capacity=capacity,
        node_info=parsed.offer if parsed is not None and session.node else None,
        node_info_text=parsed.text if parsed is not None and session.node else None,
        lease_seconds=f.integer(
            "leaseSeconds",
            default=settings.lease.default_seconds,
            minimum=1,
            maximum=settings.lease.max_seconds,
        ),
    )
    wait = f.number(
        "wait", default=settings.poll.claim_default_wait, minimum=0, maximum=settings.poll.max_wait
    )
    scope = _scope(request)
    loop = asyncio.get_running_loop()
    deadline = hold_deadline(loop.time(), wait, tick=settings.poll.coalesce_seconds)
    signal = store.tasks_changed
    result = ClaimResult(tasks=[], next_due=None)
    carried: int | None = None  # a wake-up received and not yet answered by a claim
    carried_for, carried_item = 0, None  # the notify that wake-up is for, and its work
    accepts = claim_accepts(namespaces=req.namespaces, offer=req.node_info)
    woken = True
    try:
        while not _disconnected(request):
            # In line before reading, so a task committed meanwhile wakes this claim (a claim
            # that can take nothing waits aside: new work is not for it).
            ticket = signal.ticket(in_line=req.capacity > 0, accepts=accepts)
            try:
                result = await store.claim(req=req, scope=scope)
                if carried is not None:
                    # The wake was for work this claim cannot take (another node or namespace),
                    # or it filled up and more may wait: the next claim in line tries.
                    if (not result.tasks and result.work_elsewhere) or len(result.tasks) >= req.capacity > 0:
                        signal.pass_on(carried, carried_for, carried_item)
                    carried = None
                remaining = deadline - loop.time()
                if result.tasks or signal.closed or remaining <= 0:
                    break
                timeout = remaining
                if result.next_due is not None and req.capacity > 0:
                    timeout = min(timeout, max(0.005, result.next_due - time.time()))
                woken = await wait_for_event(ticket.event, timeout)
            finally:
                woke = signal.finish(ticket)
                if woke is not None:
                    carried, carried_for, carried_item = woke, ticket.wake_for, ticket.wake_item
            if not woken and carried is None and deadline - loop.time() <= 0:
                # The hold ran out and nothing woke it: no task came for it since its last read
                # (one due meanwhile would have ended the wait sooner). The daemon claims again
                # at once; reading again here would only find what that claim finds.
                break
    finally:
        if carried is not None:
            # Leaving (answered, disconnected, shut down) with a wake-up it did not try: the
            # claim read before the task that woke it may have been committed.
            signal.pass_on(carried + 1, carried_for, carried_item)
    if result.tasks:
        request.app[METRICS].claimed(result.waited)
        log.info(
            "claimed",
            daemon=req.daemon_id,
            node=req.node,
            count=len(result.tasks),
            tasks=[t["taskId"] for t in result.tasks[:20]],
        )
    return json_response({"tasks": result.tasks})


@routes.post("/v1/dispatch/renew")
async def renew(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    f = Fields(await read_object(request))
    task_ids = f.strings("taskIds", max_items=_MAX_IDS)
    lease_seconds = f.integer(
        "leaseSeconds",
        default=settings.lease.default_seconds,
        minimum=1,
        maximum=settings.lease.max_seconds,
    )
    session = _session(request, f)
    renewed, lost = await request.app[STORE].renew(
        session=session, task_ids=task_ids, lease_seconds=lease_seconds
    )
    return json_response(RenewAnswer(renewed=renewed, lost=lost))


@routes.post("/v1/dispatch/release")
async def release(request: web.Request) -> web.Response:
    """Hand back the leases ``taskIds`` names, or with ``"all": true`` every lease the daemon
    holds (a daemon that stops: a claim answered while it stopped holds tasks it never saw)."""
    f = Fields(await read_object(request))
    every = f.boolean("all", default=False)
    session = _session(request, f)
    if every:
        if "taskIds" in f.data:
            raise Unprocessable('body: give "taskIds" or "all": true, not both')
        released = await request.app[STORE].release_all(session=session)
    else:
        task_ids = f.strings("taskIds", max_items=_MAX_IDS)
        released = await request.app[STORE].release(session=session, task_ids=task_ids)
    return json_response({"released": released})


def _completion(f: Fields) -> TaskCompletion:
    return TaskCompletion(
        task_id=f.req_string("taskId"),
        ok=f.boolean("ok"),
        error=f.text("error", required=False),
        retryable=f.boolean("retryable", default=False),
        result=f.mapping("result"),
        attempt=f.integer("attempt", default=0),  # the lease's epoch, as claimed (0: not sent)
    )


@routes.post("/v1/dispatch/complete")
async def complete(request: web.Request) -> web.Response:
    f = Fields(await read_object(request))
    item = _completion(f)
    body = await request.app[STORE].complete(session=_session(request, f), item=item)
    return json_response(body)


@routes.post("/v1/dispatch/completions")
async def complete_batch(request: web.Request) -> web.Response:
    """Many completions in one request and one transaction, each answered (``httpStatus`` and
    ``body``) as :func:`complete` would answer it alone (see :mod:`nymph.queue.sql.completions`)."""
    f = Fields(await read_object(request))
    raws = f.objects("completions", max_items=_MAX_COMPLETIONS)
    session = _session(request, f)
    parsed: list[TaskCompletion | ServiceError] = []
    for i, raw in enumerate(raws):
        try:
            parsed.append(_completion(Fields(raw, where=f"body.completions[{i}]")))
        except ServiceError as exc:
            parsed.append(exc)
    items = [p for p in parsed if isinstance(p, TaskCompletion)]
    done = iter(await request.app[STORE].complete_many(session=session, items=items) if items else [])
    answers = []
    for raw, p in zip(raws, parsed, strict=True):
        outcome = next(done) if isinstance(p, TaskCompletion) else p
        task_id = raw.get("taskId") if isinstance(raw.get("taskId"), str) else None
        if isinstance(outcome, ServiceError):
            error = {"error": outcome.code, "detail": outcome.detail}
            answers.append({"taskId": task_id, "httpStatus": outcome.status, "body": error})
        else:
            answers.append({"taskId": task_id, "httpStatus": 200, "body": outcome})
    return json_response({"answers": answers})


def _report(raw: dict[str, Any], index: int) -> Report:
    f = Fields(raw, where=f"body.reports[{index}]")
    state = f.req_string("state")
    if state not in _STATES:
        raise Unprocessable(
            f"body.reports[{index}].state {state!r} is not an instance state; use one of "
            f"{', '.join(sorted(_STATES))}"
        )
    reason = f.string("reason", required=False)
    if reason is not None and reason not in _REASONS:
        raise Unprocessable(
            f"body.reports[{index}].reason {reason!r} is not a known reason; use one of "
            f"{', '.join(sorted(_REASONS))} or null"
        )
    at_text = f.string("at", required=False, max_len=64)
    try:
        at = time.time() if at_text is None else parse_iso(at_text)
        if not 0 <= at < _LATEST:
            raise ValueError(at_text)
    except (ValueError, OverflowError):
        raise Unprocessable(f"body.reports[{index}].at {at_text!r} is not an ISO 8601 time") from None
    exit_code = raw.get("exitCode")
    termination = None
    if exit_code is not None:
        code = f.integer("exitCode", minimum=-(2**31), maximum=2**31)
        termination = (
            code,
            f.string("terminationReason", required=False, max_len=200) or "",
            f.text("terminationMessage", required=False) or "",
        )
    return Report(
        termination=termination,
        seq=f.integer("seq", minimum=0, maximum=2**62),
        instance_id=f.req_string("instanceId"),
        state=state,
        reason=reason,
        message=f.text("message", required=False),
        node=f.string("node", required=False) or None,
        at=at,
    )


@routes.post("/v1/dispatch/report")
async def report(request: web.Request) -> web.Response:
    f = Fields(await read_object(request))
    stream = f.req_string("stream")
    reports = [_report(r, i) for i, r in enumerate(f.objects("reports", max_items=10_000))]
    session = _session(request, f)
    with logged_refusal(session=session, route="report"):
        accepted, last = await request.app[STORE].report(session=session, stream=stream, reports=reports)
    return json_response(ReportAck(accepted=accepted, lastSeq=last))


@routes.post("/v1/dispatch/logs")
async def upload_logs(request: web.Request) -> web.Response:
    f = Fields(await read_object(request))
    logs = f.text("logs", required=False) or ""
    instance_id = f.req_string("instanceId")
    session = _session(request, f)
    with logged_refusal(session=session, route="logs"):
        await request.app[STORE].upload_logs(session=session, instance_id=instance_id, logs=logs)
    return web.Response(status=204)


@routes.get("/v1/dispatch/active")
async def active(request: web.Request) -> web.Response:
    node = request.query.get("node")
    if not node:
        raise BadRequest("pass ?node=NODE_NAME, the node whose instances you run", code="invalid_query")
    session = _session(request)
    if node != session.node:
        raise Forbidden(
            f"this session is for node {session.node!r}, not {node!r}: ask for your own node",
            code="wrong_node",
        )
    items = await request.app[STORE].active(session=session)
    return json_response({"items": items})
