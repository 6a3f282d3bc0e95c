"""The console's pages: namespaces with their providers and modes, a provider's instances
(filtered, paged), one instance (history, log, results, Pod), daemons and, for admin tokens,
every namespace's quota and usage.

Each reads through the same store, list and dispatcher calls as the JSON API's routes, with
the principal the guard resolved, so what a page shows is what the API would answer that token.
"""

from __future__ import annotations

from typing import Any

import yaml
from aiohttp import web

from nymph.launch.state import InstanceState
from nymph.queue.console.views import page
from nymph.queue.direct.wiring import DISPATCHERS
from nymph.queue.errors import BadRequest, Forbidden
from nymph.queue.http.keys import PRINCIPAL, STORE
from nymph.queue.http.paging import listing
from nymph.queue.models import Principal, Role
from nymph.queue.paging import PageRequest
from nymph.queue.sql import podview

routes = web.RouteTableDef()
NS = "/ns/{ns}"
INSTANCE = NS + "/providers/{name}/instances/{id}"
STATES = tuple(s.value for s in InstanceState)
#: Instances shown per page unless ``limit`` says otherwise.
PAGE_SIZE = 50
#: The end of a log an instance's page shows (the whole log downloads from its log link).
LOG_SHOWN = 256 * 1024
#: States whose log may still grow (the page follows it).
LIVE = frozenset({"queued", "starting", "running", "stopping", "unknown"})


def _signed_in(request: web.Request) -> Principal:
    return request[PRINCIPAL]


async def _catalog(request: web.Request, ns: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    lists = request.config_dict[STORE].lists
    first = PageRequest(limit=500)
    providers = await lists.providers(ns=ns, page=first)
    modes = await lists.modes(ns=ns, page=first)
    return providers.items, modes.items


async def home(request: web.Request) -> web.Response:
    principal = _signed_in(request)
    store = request.config_dict[STORE]
    spaces = []
    for ns in await store.lists.namespaces(principal=principal):
        providers, modes = await _catalog(request, ns)
        spaces.append({"name": ns, "providers": providers, "modes": modes})
    return page(request, "namespaces.html", spaces=spaces)


@routes.get(NS + "/", name="namespace")
async def namespace(request: web.Request) -> web.Response:
    ns = request.match_info["ns"]
    providers, modes = await _catalog(request, ns)
    return page(request, "namespace.html", ns=ns, providers=providers, modes=modes)


def instance_query(request: web.Request) -> tuple[str | None, PageRequest, Any]:
    """The state filter and page a list page asks for, checked as the API checks them."""
    state = request.query.get("state") or None
    if state is not None and state not in STATES:
        raise BadRequest(f"state {state!r} is not an instance state; use one of {', '.join(STATES)}")
    m = request.match_info
    paged = listing("instances", m["ns"], m["name"], state, arity=2)
    asked = paged.request(request)
    limit = asked.limit if "limit" in request.query else PAGE_SIZE
    return state, PageRequest(limit=limit, after=asked.after), paged


async def instances_page(
    request: web.Request, *, form: dict[str, str] | None = None, errors: dict[str, str] | None = None
) -> web.Response:
    m = request.match_info
    state, asked, paged = instance_query(request)
    dispatcher = await request.config_dict[DISPATCHERS].for_provider(ns=m["ns"], provider=m["name"])
    found = await dispatcher.list_instances(ns=m["ns"], provider=m["name"], state=state, page=asked)
    answer = paged.answer(found)
    _, modes = await _catalog(request, m["ns"])
    usable = [md for md in modes if md.get("provider") in (None, m["name"])]
    return page(
        request,
        "instances.html",
        status=400 if errors else 200,
        ns=m["ns"],
        provider=m["name"],
        items=answer["items"],
        live=any(i["state"] in LIVE for i in answer["items"]),
        next_token=answer.get("continue"),
        state=state or "",
        states=STATES,
        limit=asked.limit,
        modes=usable,
        form=form or {},
        errors=errors or {},
    )


@routes.get(NS + "/providers/{name}/", name="instances")
async def instances(request: web.Request) -> web.Response:
    return await instances_page(request)


def ended_at(inst: dict[str, Any]) -> str | None:
    """When the instance reached ``stopped``, from its history."""
    for entry in reversed(inst.get("history") or []):
        if entry.get("state") == "stopped":
            return str(entry.get("at"))
    return None


@routes.get(INSTANCE, name="instance")
async def instance(request: web.Request) -> web.Response:
    m = request.match_info
    store = request.config_dict[STORE]
    inst = await store.get_instance(ns=m["ns"], provider=m["name"], instance_id=m["id"])
    status = await store.output.status(instance_id=m["id"])
    since = max(0, (status.total if status is not None else 0) - LOG_SHOWN)
    stored, tail = await store.output.read_all(
        ns=m["ns"], provider=m["name"], instance_id=m["id"], since=since
    )
    if stored is not None and (stored.status.total > 0 or tail is None):
        log_text, offset = stored.data.decode("utf-8", errors="replace"), stored.next_offset
    else:
        log_text, since = (tail or "")[-LOG_SHOWN:], 0
        offset = len((tail or "").encode("utf-8"))
    results = await store.output.results(ns=m["ns"], provider=m["name"], instance_id=m["id"])
    pod = await store.db.read(lambda c: podview.pod_of(c, instance_id=m["id"]))
    return page(
        request,
        "instance.html",
        ns=m["ns"],
        provider=m["name"],
        inst=inst,
        ended=ended_at(dict(inst)),
        live=inst["state"] in LIVE,
        log_text=log_text,
        log_offset=offset,
        log_skipped=since,
        results=results,
        pod_yaml=None if pod is None else yaml.safe_dump(pod, sort_keys=False, width=100),
    )


@routes.get("/daemons", name="daemons")
async def daemons(request: web.Request) -> web.Response:
    principal = _signed_in(request)
    paged = listing("daemons", principal.namespace, arity=2)
    found = paged.answer(
        await request.config_dict[STORE].lists.daemons(principal=principal, page=paged.request(request))
    )
    return page(request, "daemons.html", items=found["items"], next_token=found.get("continue"))


@routes.get("/quotas", name="quotas")
async def quotas(request: web.Request) -> web.Response:
    if _signed_in(request).role is not Role.ADMIN:
        raise Forbidden("every namespace's quota is for admin tokens", code="admin_required")
    return page(request, "quotas.html", items=await request.config_dict[STORE].quotas.list())
