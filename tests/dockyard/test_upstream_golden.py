"""nymph renders what dockyard-k8s renders for DRA claims and plain Ray worker groups.

Each ``golden/<case>.infra.yaml`` sits beside ``golden/<case>.upstream.yaml``, dockyard-k8s's
own render of it (``golden/render_upstream.py`` writes them from its source). nymph's render of
the same infra must give the same objects in the same order; the same ComputeDomain and
ResourceClaimTemplate (nymph adds only its own managed-by label); and in the Ray object the
same worker groups, replicas, resource claims (rewritten to the cluster-unique templates) and
container claims. A plain Ray worker group (the only one, or one named ``workers``) keeps its
start parameters and env exactly as dockyard-k8s renders them: no fleet tag, no role env.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from nymph.dockyard.render import fleets
from nymph.dockyard.render.k8s import MANAGED_BY_KEY, Manifest
from nymph.dockyard.render.manifests import render_manifests
from nymph.dockyard.spec.parse import parse_infra

GOLDEN = Path(__file__).resolve().parent / "golden"
CASES = sorted(p.name.removesuffix(".infra.yaml") for p in GOLDEN.glob("*.infra.yaml"))
DRA_KINDS = ("ComputeDomain", "ResourceClaimTemplate")
#: the worker groups of each case that are plain Ray groups (no fleet role)
PLAIN = {"single-workers": {"workers"}, "workers-beside-fleets": {"workers"}}


def load(case: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    infra = yaml.safe_load((GOLDEN / f"{case}.infra.yaml").read_text(encoding="utf-8"))
    upstream = list(yaml.safe_load_all((GOLDEN / f"{case}.upstream.yaml").read_text(encoding="utf-8")))
    return [dict(m) for m in render_manifests(infra=parse_infra(infra))], upstream


def ray_spec(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    ray = next(m for m in manifests if m["kind"] in ("RayJob", "RayCluster"))
    spec: dict[str, Any] = ray["spec"]["rayClusterSpec"] if ray["kind"] == "RayJob" else ray["spec"]
    return spec


def without_nymph_label(manifest: dict[str, Any]) -> dict[str, Any]:
    labels = {k: v for k, v in manifest["metadata"]["labels"].items() if k != MANAGED_BY_KEY}
    return {**manifest, "metadata": {**manifest["metadata"], "labels": labels}}


def group_shape(group: dict[str, Any]) -> dict[str, Any]:
    pod = group["template"]["spec"]
    return {
        "groupName": group["groupName"],
        "replicas": (group.get("replicas"), group.get("minReplicas"), group.get("maxReplicas")),
        "resourceClaims": pod.get("resourceClaims"),
        "containerClaims": [(c.get("resources") or {}).get("claims") for c in pod["containers"]],
    }


def role_env(group: dict[str, Any]) -> list[str | None]:
    return [
        next((e["value"] for e in c.get("env") or [] if e["name"] == fleets.ROLE_ENV), None)
        for c in group["template"]["spec"]["containers"]
    ]


def test_every_case_has_its_upstream_render() -> None:
    """Each case has dockyard-k8s's render beside it (and no render lacks its case)."""
    assert len(CASES) >= 5
    rendered = sorted(p.name.removesuffix(".upstream.yaml") for p in GOLDEN.glob("*.upstream.yaml"))
    assert rendered == CASES


@pytest.mark.parametrize("case", CASES)
def test_same_objects_in_the_same_order(case: str, validate: Callable[[Manifest], None]) -> None:
    """Kinds and names, in apply order, are dockyard-k8s's; every object but the ComputeDomain
    (whose CRD is NVIDIA's driver's) passes strict schema validation."""
    ours, upstream = load(case)
    assert [(m["kind"], m["metadata"]["name"]) for m in ours] == [
        (m["kind"], m["metadata"]["name"]) for m in upstream
    ]
    for manifest in ours:
        if manifest["kind"] != "ComputeDomain":
            validate(manifest)  # type: ignore[arg-type]


@pytest.mark.parametrize("case", CASES)
def test_dra_objects_are_upstreams(case: str) -> None:
    """The ComputeDomain and ResourceClaimTemplate equal dockyard-k8s's but for nymph's label."""
    ours, upstream = load(case)
    mine = [without_nymph_label(m) for m in ours if m["kind"] in DRA_KINDS]
    assert mine == [m for m in upstream if m["kind"] in DRA_KINDS]
    for manifest in ours:
        if manifest["kind"] in DRA_KINDS:
            assert manifest["metadata"]["labels"][MANAGED_BY_KEY] == "nymph"


@pytest.mark.parametrize("case", CASES)
def test_worker_groups_and_claims_are_upstreams(case: str) -> None:
    """Groups, replicas, pod and container claims (rewritten names included) and the head's
    claims match; fleet groups carry their role, plain groups are rendered as dockyard-k8s
    renders them."""
    ours, upstream = load(case)
    mine, theirs = ray_spec(ours), ray_spec(upstream)
    assert [group_shape(g) for g in mine["workerGroupSpecs"]] == [
        group_shape(g) for g in theirs["workerGroupSpecs"]
    ]
    head = "headGroupSpec"
    assert mine[head]["template"]["spec"].get("resourceClaims") == theirs[head]["template"]["spec"].get(
        "resourceClaims"
    )
    plain = PLAIN.get(case, set())
    for group, reference in zip(mine["workerGroupSpecs"], theirs["workerGroupSpecs"], strict=True):
        if group["groupName"] in plain:
            assert role_env(group) == [None]
            assert group.get("rayStartParams") == reference.get("rayStartParams")
            assert [c["env"] for c in group["template"]["spec"]["containers"]] == [
                c["env"] for c in reference["template"]["spec"]["containers"]
            ]
        else:
            role = next(r for r in fleets.ROLES if group["groupName"].startswith(r))
            assert role_env(group) == [role]
            assert fleets.tag(role) in group["rayStartParams"]["resources"]
