"""User routes: providers, modes, launches (Pod and dockyard), instances, logs, probes, tasks,
daemons.

Every route is under ``/v1/namespaces/{ns}``; the auth middleware has already checked the
token, its role and its namespace scope, and that ``ns`` is a DNS-1123 label. A dockyard launch
is rendered here, in full and off the event loop, before the store is asked to queue it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from nymph.dockyard.errors import DockyardConfigError
from nymph.dockyard.render.limits import ReplicaCap, RequestCaps, check_replicas, check_requests
from nymph.dockyard.render.task import dockyard_task_manifests
from nymph.errors import ConfigError
from nymph.launch.config import (
    DEFAULT_DISPATCH,
    LAUNCHER,
    Mode,
    Provider,
    check_dispatch_kwargs,
    check_launcher,
)
from nymph.launch.placement import parse_quantity
from nymph.launch.podpolicy import PodPolicyError, check_manifests
from nymph.launch.state import InstanceState
from nymph.protocol import InstanceJSON
from nymph.queue import tenancy
from nymph.queue.direct.wiring import CONNECTOR, DISPATCHERS
from nymph.queue.errors import BadRequest, NotFound, Unavailable
from nymph.queue.http.bodies import Fields, query_int, query_number, read_object
from nymph.queue.http.keys import PRINCIPAL, SETTINGS, STORE
from nymph.queue.models import TenancySettings
from nymph.queue.notify import wait_for_event
from nymph.queue.threads import Stopping, run_cpu

routes = web.RouteTableDef()
NS = "/v1/namespaces/{ns}"
_STATES = frozenset(s.value for s in InstanceState)
_MAX_KEY_LEN = 255
_MAX_OVERRIDES = 1000


def check_name(name: object, *, what: str) -> str:
    """Provider and mode names: 1-253 printable characters, no '/', no surrounding spaces."""
    if (
        not isinstance(name, str)
        or not name
        or len(name) > 253
        or "/" in name
        or not name.isprintable()
        or name != name.strip()
    ):
        raise BadRequest(
            f"{what} name {name!r} is not valid: use 1-253 printable characters without '/' "
            "or surrounding spaces",
            code="invalid_name",
        )
    return name


def _provider_from(data: dict[str, Any], *, path_name: str | None) -> Provider:
    f = Fields(data)
    f.reject_unknown({"name", "launcher", "kwargs", "dispatch"})
    name = f.string("name", required=path_name is None)
    if path_name is not None and name is not None and name != path_name:
        raise BadRequest(f"body name {name!r} differs from the URL's {path_name!r}", code="name_mismatch")
    name = check_name(name or path_name, what="provider")
    launcher = data.get("launcher")
    if launcher != LAUNCHER:
        try:
            check_launcher(launcher)
        except ConfigError as exc:
            raise BadRequest(str(exc), code="unsupported_launcher") from None
    kwargs = f.mapping("kwargs") or {}
    dispatch = f.string("dispatch", required=False) or DEFAULT_DISPATCH
    try:
        return Provider(name=name, kwargs=kwargs, launcher=LAUNCHER, dispatch=dispatch)
    except ConfigError as exc:
        raise BadRequest(str(exc), code="invalid_provider") from None


def _mode_from(data: dict[str, Any], *, path_name: str | None) -> Mode:
    f = Fields(data)
    f.reject_unknown({"name", "provider", "fields"})
    name = f.string("name", required=path_name is None)
    if path_name is not None and name is not None and name != path_name:
        raise BadRequest(f"body name {name!r} differs from the URL's {path_name!r}", code="name_mismatch")
    name = check_name(name or path_name, what="mode")
    provider = f.string("provider", required=False)
    fields = dict(f.mapping("fields") or {})
    if "provider" in fields:  # the provider given as a field, as lakeshore's CLI writes it
        named = fields.pop("provider")
        if provider not in (None, named):
            raise BadRequest(
                f"fields.provider {named!r} differs from provider {provider!r}", code="invalid_mode"
            )
        provider = named if isinstance(named, str) else None
        if provider is None:
            raise BadRequest("fields.provider must be a provider name", code="invalid_mode")
    if provider is not None:
        check_name(provider, what="provider")
    try:
        return Mode(name=name, provider=provider, fields=fields)
    except ConfigError as exc:
        raise BadRequest(str(exc), code="invalid_mode") from None


def check_dockyard(
    spec: Mapping[str, Any],
    *,
    max_replicas: int,
    max_pod_requests: Mapping[str, str] | None = None,
    team: tuple[TenancySettings, str] | None = None,
) -> None:
    """Render a dockyard task spec exactly as the daemon will (pure, CPU only, within the
    render budget), then hold every pod template to the Pod policy (no hostPath at all), every
    replica count to ``max_replicas`` and every pod's requests to ``max_pod_requests``
    (resource -> quantity); raises :class:`BadRequest` with the one-line message (file or
    object, key path, what is allowed)."""
    caps = RequestCaps(max_per_pod={r: parse_quantity(q) for r, q in (max_pod_requests or {}).items()})
    try:
        manifests = dockyard_task_manifests(
            recipe=spec["recipe"],
            infra=spec["infra"],
            overrides=spec["overrides"],
            namespace=spec["namespace"],
        )
        check_manifests(manifests, prefix="dockyard: ")
        check_replicas(manifests, cap=ReplicaCap(max_replicas=max_replicas), prefix="dockyard: ")
        check_requests(manifests, caps=caps, prefix="dockyard: ")
        if team is not None:  # (settings, control-plane namespace): the ServiceAccounts it may use
            tenancy.check_manifest_service_accounts(
                team[0], namespace=team[1], manifests=manifests, prefix="dockyard: "
            )
    except (DockyardConfigError, PodPolicyError) as exc:
        raise BadRequest(str(exc), code="invalid_dockyard") from None
    except RecursionError:
        raise BadRequest(
            "the dockyard launch is nested too deep to render: flatten the recipe or infra",
            code="invalid_dockyard",
        ) from None


def _tenancy(request: web.Request, kwargs: Mapping[str, Any], *, where: str) -> None:
    """Refuse a provider or mode that names a Kubernetes namespace or ServiceAccount its team
    may not use (checked again for every launch)."""
    tenancy.check_kwargs(
        request.app[SETTINGS].tenancy,
        principal=request[PRINCIPAL],
        namespace=request.match_info["ns"],
        kwargs=kwargs,
        where=where,
    )


async def _check_mode_provider(request: web.Request, mode: Mode) -> None:
    """A mode bound to a ``dispatch: daemon`` provider may not carry ``kubeconfig`` or
    ``context`` (they would mean nothing there)."""
    if mode.provider is None:
        return
    try:
        provider = await request.app[STORE].get_provider_config(
            ns=request.match_info["ns"], name=mode.provider
        )
    except NotFound:
        return  # a mode may be saved before its provider; the launch checks it again
    try:
        check_dispatch_kwargs(provider, mode)
    except ConfigError as exc:
        raise BadRequest(str(exc), code="invalid_mode") from None


def _json(data: Any, *, status: int = 200) -> web.Response:
    return web.json_response(data, status=status)


# --- providers -----------------------------------------------------------------------------


@routes.post(NS + "/providers")
async def create_provider(request: web.Request) -> web.Response:
    provider = _provider_from(await read_object(request), path_name=None)
    _tenancy(request, provider.kwargs, where="provider")
    provider = await request.app[CONNECTOR].prepare_provider(
        ns=request.match_info["ns"], provider=provider, principal=request[PRINCIPAL]
    )
    body = await request.app[STORE].put_provider(
        ns=request.match_info["ns"], provider=provider, replace=False
    )
    return _json(body, status=201)


@routes.put(NS + "/providers/{name}")
async def replace_provider(request: web.Request) -> web.Response:
    provider = _provider_from(await read_object(request), path_name=request.match_info["name"])
    _tenancy(request, provider.kwargs, where="provider")
    provider = await request.app[CONNECTOR].prepare_provider(
        ns=request.match_info["ns"], provider=provider, principal=request[PRINCIPAL]
    )
    body = await request.app[STORE].put_provider(ns=request.match_info["ns"], provider=provider, replace=True)
    return _json(body)


@routes.get(NS + "/providers")
async def list_providers(request: web.Request) -> web.Response:
    items = await request.app[STORE].list_providers(ns=request.match_info["ns"])
    return _json({"items": items})


@routes.get(NS + "/providers/{name}")
async def get_provider(request: web.Request) -> web.Response:
    m = request.match_info
    return _json(await request.app[STORE].get_provider(ns=m["ns"], name=m["name"]))


@routes.delete(NS + "/providers/{name}")
async def delete_provider(request: web.Request) -> web.Response:
    m = request.match_info
    await request.app[STORE].delete_provider(ns=m["ns"], name=m["name"])
    return web.Response(status=204)


# --- modes ---------------------------------------------------------------------------------


@routes.post(NS + "/modes")
async def create_mode(request: web.Request) -> web.Response:
    mode = _mode_from(await read_object(request), path_name=None)
    _tenancy(request, mode.fields, where="mode")
    await _check_mode_provider(request, mode)
    mode = await request.app[CONNECTOR].prepare_mode(
        ns=request.match_info["ns"], mode=mode, principal=request[PRINCIPAL]
    )
    body = await request.app[STORE].put_mode(ns=request.match_info["ns"], mode=mode, replace=False)
    return _json(body, status=201)


@routes.put(NS + "/modes/{name}")
async def replace_mode(request: web.Request) -> web.Response:
    mode = _mode_from(await read_object(request), path_name=request.match_info["name"])
    _tenancy(request, mode.fields, where="mode")
    await _check_mode_provider(request, mode)
    mode = await request.app[CONNECTOR].prepare_mode(
        ns=request.match_info["ns"], mode=mode, principal=request[PRINCIPAL]
    )
    body = await request.app[STORE].put_mode(ns=request.match_info["ns"], mode=mode, replace=True)
    return _json(body)


@routes.get(NS + "/modes")
async def list_modes(request: web.Request) -> web.Response:
    return _json({"items": await request.app[STORE].list_modes(ns=request.match_info["ns"])})


@routes.get(NS + "/modes/{name}")
async def get_mode(request: web.Request) -> web.Response:
    m = request.match_info
    return _json(await request.app[STORE].get_mode(ns=m["ns"], name=m["name"]))


@routes.delete(NS + "/modes/{name}")
async def delete_mode(request: web.Request) -> web.Response:
    m = request.match_info
    await request.app[STORE].delete_mode(ns=m["ns"], name=m["name"])
    return web.Response(status=204)


# --- launches and instances ----------------------------------------------------------------


def _idempotency_key(request: web.Request) -> str | None:
    key = request.headers.get("Idempotency-Key")
    if key is None:
        return None
    if not key or len(key) > _MAX_KEY_LEN or not key.isprintable():
        raise BadRequest(
            f"Idempotency-Key must be 1-{_MAX_KEY_LEN} printable characters (a UUID is ideal)",
            code="invalid_idempotency_key",
        )
    return key


@routes.post(NS + "/providers/{name}/launch")
async def launch(request: web.Request) -> web.Response:
    m = request.match_info
    key = _idempotency_key(request)
    data = await read_object(request)
    f = Fields(data)
    f.req_string("mode")
    for name in ("tags", "env", "fields"):
        f.mapping(name)
    dispatcher = await request.app[DISPATCHERS].for_provider(ns=m["ns"], provider=m["name"])
    accepted = await dispatcher.launch(
        ns=m["ns"], provider=m["name"], body=data, idempotency_key=key, principal=request[PRINCIPAL]
    )
    return _json(accepted, status=202)


@routes.post(NS + "/providers/{name}/dockyard")
async def launch_dockyard(request: web.Request) -> web.Response:
    """A dockyard launch: ``{"recipe": {...}, "infra"?: {...}, "overrides"?: ["k=v", ...]}``,
    rendered in full for the provider's kube namespace before it is accepted."""
    m = request.match_info
    key = _idempotency_key(request)
    f = Fields(await read_object(request))
    f.reject_unknown({"recipe", "infra", "overrides"})
    recipe = f.mapping("recipe", required=True)
    assert recipe is not None
    infra = f.mapping("infra") or {}
    overrides = f.strings("overrides", required=False, max_items=_MAX_OVERRIDES)
    store = request.app[STORE]
    kube_ns = await store.provider_kube_namespace(ns=m["ns"], name=m["name"])
    if (await store.get_provider_config(ns=m["ns"], name=m["name"])).direct:
        raise BadRequest(
            f"provider {m['name']!r} is a dispatch: direct provider; dockyard launches need a "
            "dispatch: daemon provider (a nymph daemon in the cluster applies them)",
            code="invalid_dockyard",
        )
    tenancy.check_target(
        request.app[SETTINGS].tenancy,
        principal=request[PRINCIPAL],
        kube_namespace=kube_ns,
        field=f"provider {m['name']!r} namespace",
    )
    body = {"recipe": dict(recipe), "infra": dict(infra), "overrides": list(overrides)}
    limits = request.app[SETTINGS].tenancy
    try:
        await run_cpu(
            check_dockyard,
            {**body, "namespace": kube_ns},
            max_replicas=limits.max_replicas,
            max_pod_requests=limits.max_pod_requests,
            team=(limits, m["ns"]),
        )
    except Stopping:
        raise Unavailable("the queue is stopping: send the launch again", code="stopping") from None
    accepted = await store.launch_dockyard(
        ns=m["ns"],
        provider=m["name"],
        body=body,
        kube_ns=kube_ns,
        idempotency_key=key,
        principal=request[PRINCIPAL],
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
    dispatcher = await request.app[DISPATCHERS].for_provider(ns=m["ns"], provider=m["name"])
    items = await dispatcher.list_instances(ns=m["ns"], provider=m["name"], state=state)
    return _json({"items": items})


@routes.get(NS + "/providers/{name}/instances/{id}")
async def get_instance(request: web.Request) -> web.Response:
    """The instance; with ``?after=V&wait=S`` held until its version exceeds V (long-poll)."""
    m = request.match_info
    store = request.app[STORE]
    after = query_int(request, "after", minimum=-1, maximum=2**62)
    wait = query_number(request, "wait", default=0.0, minimum=0, maximum=request.app[SETTINGS].poll.max_wait)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + (wait or 0.0)
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
    return _json({"items": await request.app[STORE].list_daemons(principal=request[PRINCIPAL])})
