"""Namespaces' scheduling settings: ``GET``/``PUT /v1/namespaces/{ns}/quota`` and ``GET
/v1/quotas`` (see :mod:`nymph.queue.quotas` for the body).

Only an admin token may set a quota or list every namespace's; a user token of the namespace
(or an unscoped one) may read its own.
"""

from __future__ import annotations

from aiohttp import web

from nymph.errors import ValidationError
from nymph.queue.errors import BadRequest, Forbidden
from nymph.queue.http.answers import json_response
from nymph.queue.http.bodies import read_object
from nymph.queue.http.keys import PRINCIPAL, STORE
from nymph.queue.models import Principal, Role

routes = web.RouteTableDef()


def _admin(principal: Principal, what: str) -> None:
    if principal.role is not Role.ADMIN:
        raise Forbidden(
            f"{what} takes an admin token: create one on the queue host with "
            "'nymph queue token create --role admin'",
            code="admin_required",
        )


@routes.get("/v1/namespaces/{ns}/quota")
async def get_quota(request: web.Request) -> web.Response:
    return json_response(await request.app[STORE].quotas.get(request.match_info["ns"]))


@routes.put("/v1/namespaces/{ns}/quota")
async def put_quota(request: web.Request) -> web.Response:
    _admin(request[PRINCIPAL], "setting a namespace's quota")
    body = await read_object(request)
    store = request.app[STORE]
    try:
        answer = await store.quotas.put(request.match_info["ns"], body)
    except ValidationError as exc:
        raise BadRequest(str(exc), code="invalid_quota") from None
    # A raised limit may let queued launches start: every waiting claim looks again.
    store.tasks_changed.notify_all()
    return json_response(answer)


@routes.get("/v1/quotas")
async def list_quotas(request: web.Request) -> web.Response:
    _admin(request[PRINCIPAL], "listing every namespace's quota")
    return json_response({"items": await request.app[STORE].quotas.list()})
