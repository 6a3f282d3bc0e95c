"""Launch groups: ``POST .../providers/{name}/launches`` (many launches in one body, accepted
whole or not at all), ``GET .../groups/{id}`` (its members counted by state and reason),
``GET .../groups/{id}/instances`` (paged, as instance lists are) and ``DELETE .../groups/{id}``
(stop every member, idempotent). See :mod:`nymph.queue.sql.groups`."""

from __future__ import annotations

from aiohttp import web

from nymph.queue.direct.wiring import DISPATCHERS
from nymph.queue.http.answers import json_response
from nymph.queue.http.bodies import idempotency_key, read_object
from nymph.queue.http.keys import PRINCIPAL, STORE
from nymph.queue.http.paging import listing

routes = web.RouteTableDef()
NS = "/v1/namespaces/{ns}"
#: The body cap of a group launch (the app's is smaller): 10,000 launches of a few hundred bytes
#: each, or fewer larger ones.
GROUP_BODY_LIMIT = 16 * 1024 * 1024


@routes.post(NS + "/providers/{name}/launches")
async def launch_group(request: web.Request) -> web.Response:
    m = request.match_info
    key = idempotency_key(request)
    data = await read_object(request, limit=GROUP_BODY_LIMIT)
    accepted = await request.app[STORE].groups.launch(
        ns=m["ns"], provider=m["name"], body=data, idempotency_key=key, principal=request[PRINCIPAL]
    )
    return json_response(accepted, status=202)


@routes.get(NS + "/groups/{id}")
async def get_group(request: web.Request) -> web.Response:
    m = request.match_info
    return json_response(await request.app[STORE].groups.get(ns=m["ns"], group_id=m["id"]))


@routes.get(NS + "/groups/{id}/instances")
async def group_instances(request: web.Request) -> web.Response:
    m = request.match_info
    paged = listing("group-instances", m["ns"], m["id"], arity=2)
    found = await request.app[STORE].groups.instances(
        ns=m["ns"], group_id=m["id"], page=paged.request(request)
    )
    return json_response(paged.answer(found))


@routes.delete(NS + "/groups/{id}")
async def stop_group(request: web.Request) -> web.Response:
    """Stop every member not stopped yet: the queue stops those it can in one transaction (and
    queues the daemons' stop tasks); the Pods of direct members are deleted here."""
    m = request.match_info
    principal = request[PRINCIPAL]
    done = await request.app[STORE].groups.stop(ns=m["ns"], group_id=m["id"], principal=principal)
    direct = request.app[DISPATCHERS].direct
    for provider, instance_id in done.direct:
        await direct.stop(
            ns=m["ns"], provider=provider, instance_id=instance_id, grace=None, principal=principal
        )
    return web.Response(status=204)
