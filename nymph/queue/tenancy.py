"""What a team may reach in the cluster: the Kubernetes namespaces its launches go to and the
ServiceAccounts they run as, held to the operator's :class:`TenancySettings`.

Checked when a provider or a mode is saved (so a refused one is never stored) and again for
every launch, on the spec the launch would really run (a mode, a provider and a launch's own
``fields`` merge only then). A refusal is a 400 that names the flag that would allow it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from nymph.launch.podpolicy import pod_templates
from nymph.launch.spec import LaunchSpec
from nymph.queue.errors import BadRequest
from nymph.queue.models import Principal, TenancySettings


class NamespaceRefused(BadRequest):
    default_code = "kube_namespace_refused"


class ServiceAccountRefused(BadRequest):
    default_code = "service_account_refused"


def check_target(settings: TenancySettings, *, principal: Principal, kube_namespace: str, field: str) -> None:
    """Refuse a Kubernetes namespace the principal's team may not launch into."""
    if settings.may_target(principal, kube_namespace):
        return
    team = principal.namespace
    assert team is not None  # unscoped tokens may target any
    allowed = ", ".join(settings.kube_namespaces_of(team))
    raise NamespaceRefused(
        f"{field}: Kubernetes namespace {kube_namespace!r} is not one that namespace {team!r} "
        f"may launch into (it may use: {allowed}); the operator can allow it with "
        f"'nymph queue serve --kube-namespaces {team}={','.join((*settings.kube_namespaces_of(team), kube_namespace))}'"
    )


def check_service_account(settings: TenancySettings, *, namespace: str, name: str, field: str) -> None:
    """Refuse a ServiceAccount the operator did not allow for control-plane namespace ``namespace``."""
    if settings.may_run_as(namespace, name):
        return
    allowed = settings.service_accounts.get(namespace, ())
    which = f"it may use: {', '.join(allowed)}" if allowed else "none is allowed for it"
    raise ServiceAccountRefused(
        f"{field}: ServiceAccount {name!r} is not one that launches of namespace {namespace!r} "
        f"may run as ({which}); the operator can allow it with "
        f"'nymph queue serve --service-account {namespace}={name}', or remove service_account "
        "to run as the namespace's default ServiceAccount"
    )


def check_kwargs(
    settings: TenancySettings,
    *,
    principal: Principal,
    namespace: str,
    kwargs: Mapping[str, Any],
    where: str,
) -> None:
    """The parts of a provider's kwargs or a mode's fields that tenancy governs, as saved."""
    kube_ns = kwargs.get("namespace")
    if isinstance(kube_ns, str) and kube_ns:
        check_target(
            settings,
            principal=principal,
            kube_namespace=kube_ns,
            field=f"{where}.namespace",
        )
    sa = kwargs.get("service_account")
    if isinstance(sa, str) and sa:
        check_service_account(settings, namespace=namespace, name=sa, field=f"{where}.service_account")


def check_spec(settings: TenancySettings, *, principal: Principal, spec: LaunchSpec) -> None:
    """Every launch, on what it would really run."""
    check_target(settings, principal=principal, kube_namespace=spec.namespace, field="launch namespace")
    if spec.service_account:
        check_service_account(
            settings,
            namespace=spec.owner_namespace,
            name=spec.service_account,
            field="launch service_account",
        )


def check_manifest_service_accounts(
    settings: TenancySettings, *, namespace: str, manifests: Sequence[Mapping[str, Any]], prefix: str = ""
) -> None:
    """Every pod template of rendered manifests (a dockyard launch) runs only as a ServiceAccount
    the operator allowed for control-plane namespace ``namespace`` (or the namespace's default)."""
    for template in pod_templates(manifests):
        for key in ("serviceAccountName", "serviceAccount"):
            name = template.spec.get(key)
            if name not in (None, ""):
                check_service_account(
                    settings, namespace=namespace, name=str(name), field=f"{prefix}{template.where}.{key}"
                )
