"""User routes for providers and modes: created, replaced, listed, read and deleted, each checked
in full (launcher, dispatch, connection, the team's tenancy) before it is stored.

Every route is under ``/v1/namespaces/{ns}``; the auth middleware has already checked the token.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from nymph.errors import ConfigError
from nymph.launch.config import (
    DEFAULT_DISPATCH,
    LAUNCHER,
    Mode,
    Provider,
    check_dispatch_kwargs,
    check_launcher,
)
from nymph.queue import tenancy
from nymph.queue.direct.wiring import CONNECTOR
from nymph.queue.errors import BadRequest, NotFound
from nymph.queue.http.answers import json_response
from nymph.queue.http.bodies import Fields, read_object
from nymph.queue.http.keys import PRINCIPAL, SETTINGS, STORE
from nymph.queue.http.paging import listing

routes = web.RouteTableDef()
NS = "/v1/namespaces/{ns}"


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
    return json_response(data, status=status)


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
    ns = request.match_info["ns"]
    paged = listing("providers", ns)
    return _json(paged.answer(await request.app[STORE].lists.providers(ns=ns, page=paged.request(request))))


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
    ns = request.match_info["ns"]
    paged = listing("modes", ns)
    return _json(paged.answer(await request.app[STORE].lists.modes(ns=ns, page=paged.request(request))))


@routes.get(NS + "/modes/{name}")
async def get_mode(request: web.Request) -> web.Response:
    m = request.match_info
    return _json(await request.app[STORE].get_mode(ns=m["ns"], name=m["name"]))


@routes.delete(NS + "/modes/{name}")
async def delete_mode(request: web.Request) -> web.Response:
    m = request.match_info
    await request.app[STORE].delete_mode(ns=m["ns"], name=m["name"])
    return web.Response(status=204)
