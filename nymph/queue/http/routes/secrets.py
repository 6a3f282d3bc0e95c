"""Secret routes: ``PUT .../secrets/{name}`` ``{"value": TEXT}``, ``GET .../secrets`` (names and
dates only), ``DELETE .../secrets/{name}``. No route ever returns a value. A secret that a
provider or mode of the namespace uses as its kubeconfig is checked as a user-supplied
kubeconfig before it is set."""

from __future__ import annotations

from aiohttp import web

from nymph.queue.direct.wiring import CONNECTOR, SECRETS
from nymph.queue.http.answers import json_response
from nymph.queue.http.bodies import Fields, read_object
from nymph.queue.http.keys import STORE
from nymph.queue.http.paging import listing

routes = web.RouteTableDef()
NS = "/v1/namespaces/{ns}"


@routes.put(NS + "/secrets/{name}")
async def put_secret(request: web.Request) -> web.Response:
    f = Fields(await read_object(request))
    f.reject_unknown({"value"})
    value = f.text("value") or ""
    m = request.match_info
    # A secret a provider or mode uses as its kubeconfig passes the checks inline content does.
    store = request.app[STORE]
    configs = [p.get("kwargs") for p in await store.list_providers(ns=m["ns"])]
    configs += [md.get("fields") for md in await store.list_modes(ns=m["ns"])]
    await request.app[CONNECTOR].check_secret(ns=m["ns"], name=m["name"], value=value, configs=configs)
    return json_response(await request.app[SECRETS].put(ns=m["ns"], name=m["name"], value=value))


@routes.get(NS + "/secrets")
async def list_secrets(request: web.Request) -> web.Response:
    ns = request.match_info["ns"]
    paged = listing("secrets", ns)
    return json_response(
        paged.answer(await request.app[STORE].lists.secrets(ns=ns, page=paged.request(request)))
    )


@routes.delete(NS + "/secrets/{name}")
async def delete_secret(request: web.Request) -> web.Response:
    m = request.match_info
    await request.app[SECRETS].delete(ns=m["ns"], name=m["name"])
    return web.Response(status=204)
