"""The dockyard launch route: a recipe (and infra, overrides) rendered in full for the
provider's Kubernetes namespace, in the queue and off the event loop, within the render budget,
then held to the Pod policy, the replica and request caps and the team's ServiceAccounts,
before the store is asked to queue it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from nymph.dockyard.errors import DockyardConfigError
from nymph.dockyard.render.limits import ReplicaCap, RequestCaps, check_replicas, check_requests
from nymph.dockyard.render.task import dockyard_task_manifests
from nymph.launch.placement import parse_quantity
from nymph.launch.podpolicy import PodPolicyError, check_manifests
from nymph.queue import tenancy
from nymph.queue.errors import BadRequest, Unavailable
from nymph.queue.http.answers import json_response
from nymph.queue.http.bodies import Fields, idempotency_key, read_object
from nymph.queue.http.keys import PRINCIPAL, SETTINGS, STORE
from nymph.queue.models import TenancySettings
from nymph.queue.threads import Stopping, run_cpu

routes = web.RouteTableDef()
NS = "/v1/namespaces/{ns}"
_MAX_OVERRIDES = 1000


def check_dockyard(
    spec: Mapping[str, Any],
    *,
    max_replicas: int,
    max_pod_requests: Mapping[str, str] | None = None,
    team: tuple[TenancySettings, str] | None = None,
    max_runtime: int | None = None,
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
            max_runtime=max_runtime,
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


def _json(data: Any, *, status: int = 200) -> web.Response:
    return json_response(data, status=status)


@routes.post(NS + "/providers/{name}/dockyard")
async def launch_dockyard(request: web.Request) -> web.Response:
    """A dockyard launch: ``{"recipe": {...}, "infra"?: {...}, "overrides"?: ["k=v", ...]}``,
    rendered in full for the provider's kube namespace before it is accepted."""
    m = request.match_info
    key = idempotency_key(request)
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
    # The namespace's runtime limit becomes the RayJob's activeDeadlineSeconds.
    quota = await store.quotas.get(m["ns"])
    max_runtime = quota["defaultRuntime"] or quota["maxRuntime"]
    if quota["maxRuntime"] is not None and max_runtime is not None:
        max_runtime = min(max_runtime, quota["maxRuntime"])
    try:
        await run_cpu(
            check_dockyard,
            {**body, "namespace": kube_ns},
            max_replicas=limits.max_replicas,
            max_pod_requests=limits.max_pod_requests,
            team=(limits, m["ns"]),
            max_runtime=max_runtime,
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
        max_runtime=max_runtime,
    )
    return _json(accepted, status=202)
