"""What the daemon needs to dispatch a dockyard launch (pure: data in, data out).

A task that carries a recipe and an infra spec becomes the manifests the daemon applies, in
order, in the one namespace it serves for that task:

* the layers are the shipped defaults, the task's infra (or the recipe's ``infra:`` block)
  and the task's overrides; the daemon's own home, environment and kube context play no
  part (``${oc.env:...}`` sees an empty environment, so a value the daemon must not leak
  never lands in a manifest; resolve such values before enqueueing);
* the namespace is the task's: an infra file that names another namespace is an error,
  never silently moved;
* render-only kinds (ResourceQuota, LimitRange) are left out: namespace governance is an
  administrator's call;
* the interpolations run under a :class:`~nymph.dockyard.spec.budget.RenderBudget` (steps
  and resolved size): a recipe built to multiply work is refused with
  :class:`~nymph.dockyard.errors.DockyardBudgetError`, and the render stops there.

:data:`DOCKYARD_ROLE_RULES` are the Role rules the daemon needs on top of its Pod rules to
apply and delete those kinds in the namespaces it serves, and nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from nymph.dockyard.errors import DockyardConfigError
from nymph.dockyard.render.manifests import RENDER_ONLY_KINDS, render_manifests
from nymph.dockyard.spec.budget import RenderBudget, limited
from nymph.dockyard.spec.load import Environment, load_mappings

#: apply = server-side apply (PATCH that creates when absent, which the API server also
#: authorises as ``create``); ``get`` lets the daemon check for an object before applying
#: (adopt, don't duplicate); ``delete`` serves stop tasks and the reaper. No list/watch but
#: ``list`` on RayJobs: the daemon reads its launches' RayJobs to report their end.
_VERBS = ["get", "create", "patch", "delete"]

DOCKYARD_ROLE_RULES: list[dict[str, Any]] = [
    {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": list(_VERBS)},
    {"apiGroups": [""], "resources": ["services"], "verbs": list(_VERBS)},
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": list(_VERBS)},
    {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": list(_VERBS)},
    {"apiGroups": ["ray.io"], "resources": ["rayjobs", "rayclusters"], "verbs": list(_VERBS)},
    {"apiGroups": ["ray.io"], "resources": ["rayjobs"], "verbs": ["list"]},
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaimtemplates"], "verbs": list(_VERBS)},
    {"apiGroups": ["resource.nvidia.com"], "resources": ["computedomains"], "verbs": list(_VERBS)},
]


def task_environment() -> Environment:
    """The loader environment of a dispatched task: shipped defaults only, nothing of the
    daemon's host."""
    return Environment(
        env={},
        home=Path("/nonexistent"),
        user="unknown",
        kubeconfigs=(),
        sa_namespace_path=Path("/nonexistent"),
    )


def applicable(manifests: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The manifests a live path applies: everything but the render-only kinds."""
    return [dict(m) for m in manifests if m.get("kind") not in RENDER_ONLY_KINDS]


def dockyard_task_manifests(
    *,
    recipe: Mapping[str, Any],
    infra: Mapping[str, Any],
    overrides: Sequence[str],
    namespace: str,
    budget: RenderBudget | None = None,
    max_runtime: int | None = None,
) -> list[dict[str, Any]]:
    """The manifests of a dockyard task, in apply order, render-only kinds excluded.

    ``infra`` may be empty when the recipe carries an ``infra:`` block. Raises
    :class:`DockyardConfigError` (one line naming the key path) on any invalid input, its
    subclass :class:`~nymph.dockyard.errors.DockyardBudgetError` when the render needs more
    than ``budget`` (default: a fresh :class:`RenderBudget`, shared by every step).
    ``max_runtime`` (seconds) is a RayJob's ``spec.activeDeadlineSeconds`` (None: none).
    """
    with limited(budget if budget is not None else RenderBudget()):
        return _task_manifests(
            recipe=recipe, infra=infra, overrides=overrides, namespace=namespace, max_runtime=max_runtime
        )


def _task_manifests(
    *,
    recipe: Mapping[str, Any],
    infra: Mapping[str, Any],
    overrides: Sequence[str],
    namespace: str,
    max_runtime: int | None,
) -> list[dict[str, Any]]:
    task_infra: Mapping[str, Any] | None = infra if infra else None
    loaded = load_mappings(
        recipe=recipe, infra=task_infra, overrides=overrides, environment=task_environment()
    )
    if loaded.namespace_source != "infra":
        loaded = load_mappings(
            recipe=recipe,
            infra=task_infra,
            overrides=[*overrides, f"infra.namespace={namespace}"],
            environment=task_environment(),
        )
    elif loaded.infra.namespace != namespace:
        raise DockyardConfigError(
            f"the infra names namespace {loaded.infra.namespace!r} but the task is dispatched "
            f"to {namespace!r}; drop infra.namespace or dispatch to that namespace",
            path="infra.namespace",
            source=loaded.infra_source,
        )
    return applicable(render_manifests(infra=loaded.infra, max_runtime=max_runtime))
