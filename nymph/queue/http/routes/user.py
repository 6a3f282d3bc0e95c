"""User routes: Pod launches, instances, probes, tasks, daemons (providers and modes are in
:mod:`.catalog`, dockyard launches in :mod:`.dockyard`).

Every route is under ``/v1/namespaces/{ns}``; the auth middleware has already checked the
token, its role and its namespace scope, and that ``ns`` is a DNS-1123 label. Which dispatch
path serves a provider or an instance is the :class:`~nymph.queue.dispatcher.Dispatchers`' choice.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from nymph.launch.state import InstanceState
from nymph.protocol import InstanceJSON
from nymph.queue.direct.wiring import DISPATCHERS
from nymph.queue.errors import BadRequest
from nymph.queue.http.answers import json_response
from nymph.queue.http.bodies import Fields, idempotency_key, query_int, query_number, read_object
from nymph.queue.http.keys import PRINCIPAL, SETTINGS, STORE
from nymph.queue.http.paging import listing
from nymph.queue.notify import hold_deadline, wait_for_event

routes = web.RouteTableDef()
NS = "/v1/namespaces/{ns}"
_STATES = frozenset(s.value for s in InstanceState)


def _json(data: Any, *, status: int = 200) -> web.Response:
    return json_response(data, status=status)


# --- launches and instances ----------------------------------------------------------------


@routes.post(NS + "/providers/{name}/launch")
async def launch(request: web.Request) -> web.Response:
    m = request.match_info
    key = idempotency_key(request)
    data = await read_object(request)
    f = Fields(data)
    f.req_string("mode")
    for name in ("tags", "env", "fields"):
        f.mapping(name)
    accepted = await request.app[DISPATCHERS].launch(
        ns=m["ns"], provider=m["name"], body=data, idempotency_key=key, principal=request[PRINCIPAL]
    )
    return _json(accepted, status=202)


@routes.get(NS + "/providers/{name}/instances")
async def list_instances(request: web.Request) -> web.Response:
    m = request.match_info
    state = request.query.get("state") or None
    if state is not None and state not in _STATES:
        raise BadRequest(
            f"state {state!r} is not an instance state; use one of {', '.join(sorted(_STATES))}",
            code="invalid_query",
        )
    paged = listing("instances", m["ns"], m["name"], state, arity=2)
    page = paged.request(request)
    dispatcher = await request.app[DISPATCHERS].for_provider(ns=m["ns"], provider=m["name"])
    found = await dispatcher.list_instances(ns=m["ns"], provider=m["name"], state=state, page=page)
    return _json(paged.answer(found))


@routes.get(NS + "/providers/{name}/instances/{id}")
async def get_instance(request: web.Request) -> web.Response:
    """The instance; with ``?after=V&wait=S`` held until its version exceeds V (long-poll)."""
    m = request.match_info
    store = request.app[STORE]
    after = query_int(request, "after", minimum=-1, maximum=2**62)
    poll = request.app[SETTINGS].poll
    wait = query_number(request, "wait", default=0.0, minimum=0, maximum=poll.max_wait)
    loop = asyncio.get_running_loop()
    deadline = hold_deadline(loop.time(), wait or 0.0, tick=poll.coalesce_seconds)
    signal = store.instance_changed
    while True:
        event = signal.current(m["id"])
        try:
            inst: InstanceJSON = await store.get_instance(ns=m["ns"], provider=m["name"], instance_id=m["id"])
            remaining = deadline - loop.time()
            if after is None or inst["version"] > after or signal.closed or remaining <= 0:
                return _json(inst)
            await wait_for_event(event, remaining)
        finally:
            signal.release(m["id"], event)


@routes.delete(NS + "/providers/{name}/instances/{id}")
async def stop_instance(request: web.Request) -> web.Response:
    m = request.match_info
    grace = query_int(request, "gracePeriodSeconds", minimum=0, maximum=86_400)
    dispatcher = await request.app[DISPATCHERS].for_instance(instance_id=m["id"])
    await dispatcher.stop(
        ns=m["ns"], provider=m["name"], instance_id=m["id"], grace=grace, principal=request[PRINCIPAL]
    )
    return web.Response(status=204)


# --- probes, tasks, daemons ----------------------------------------------------------------


@routes.post(NS + "/providers/{name}/test")
async def test_provider(request: web.Request) -> web.Response:
    m = request.match_info
    data = await read_object(request, allow_empty=True)
    f = Fields(data)
    f.reject_unknown({"mode"})
    mode = f.string("mode", required=False)
    dispatcher = await request.app[DISPATCHERS].for_provider(ns=m["ns"], provider=m["name"])
    task_id = await dispatcher.probe(ns=m["ns"], provider=m["name"], mode=mode, principal=request[PRINCIPAL])
    return _json({"taskId": task_id}, status=202)


@routes.get(NS + "/tasks/{taskId}")
async def get_task(request: web.Request) -> web.Response:
    m = request.match_info
    return _json(await request.app[STORE].get_task(ns=m["ns"], task_id=m["taskId"]))


@routes.get(NS + "/daemons")
async def list_daemons(request: web.Request) -> web.Response:
    principal = request[PRINCIPAL]
    paged = listing("daemons", principal.namespace, arity=2)
    return _json(
        paged.answer(await request.app[STORE].lists.daemons(principal=principal, page=paged.request(request)))
    )
