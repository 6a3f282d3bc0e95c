"""DRA objects for the workers' well-known claims, plain Ray worker groups, and what ``check``
says it inferred: the rules nymph adds around dockyard-k8s's render (the render itself is
compared with dockyard-k8s's in test_upstream_golden.py)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from nymph.cli import main
from nymph.dockyard.errors import DockyardConfigError
from nymph.dockyard.render.manifests import render_manifests
from nymph.dockyard.spec.parse import parse_infra

Write = Callable[[str, str], Path]
CLAIMS = [
    {"name": "compute-domain-channel", "resourceClaimTemplateName": "placeholder"},
    {"name": "roce-channel", "resourceClaimTemplateName": "placeholder"},
]


def with_claims(infra: dict[str, Any], claims: Any, *, group: int = 0) -> dict[str, Any]:
    out = copy.deepcopy(infra)
    out["kuberay"]["spec"]["workerGroupSpecs"][group]["template"]["spec"]["resourceClaims"] = claims
    return out


def render(infra: dict[str, Any]) -> list[dict[str, Any]]:
    return [dict(m) for m in render_manifests(infra=parse_infra(infra))]


def refs(manifests: list[dict[str, Any]]) -> list[str]:
    return [f"{m['kind']}/{m['metadata']['name']}" for m in manifests]


def error(infra: dict[str, Any]) -> DockyardConfigError:
    with pytest.raises(DockyardConfigError) as info:
        render(infra)
    return info.value


def test_dra_objects_come_before_the_ray_object_in_bringup_too(infra_dict: dict[str, Any]) -> None:
    """In bringup the ComputeDomain and ResourceClaimTemplate precede the RayCluster, after the
    sandbox pool; attach mode renders none of them."""
    infra = with_claims(infra_dict, CLAIMS)
    infra["launch"] = {"mode": "bringup"}
    assert refs(render(infra))[-3:] == [
        "ComputeDomain/compute-domain-grpo",
        "ResourceClaimTemplate/roce-grpo",
        "RayCluster/grpo",
    ]
    infra["launch"] = {"mode": "attach", "attach": "shared"}
    assert refs(render(infra)) == [
        "Deployment/sbx",
        "Service/sbx",
        "NetworkPolicy/sbx-netpol",
        "PodDisruptionBudget/sbx-pdb",
    ]


def test_head_claims_and_other_claims_are_left_alone(infra_dict: dict[str, Any]) -> None:
    """Only worker groups' well-known claims are rewritten: a head claim of the same name and
    a worker claim of another name keep their templates, and render no DRA object."""
    infra = with_claims(infra_dict, [{"name": "scratch", "resourceClaimTemplateName": "mine"}])
    head = infra["kuberay"]["spec"]["headGroupSpec"]["template"]["spec"]
    head["resourceClaims"] = [{"name": "compute-domain-channel", "resourceClaimTemplateName": "head-own"}]
    out = render(infra)
    assert [m["kind"] for m in out if m["kind"] in ("ComputeDomain", "ResourceClaimTemplate")] == []
    spec = out[-1]["spec"]["rayClusterSpec"]
    assert spec["headGroupSpec"]["template"]["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == (
        "head-own"
    )
    worker = spec["workerGroupSpecs"][0]["template"]["spec"]
    assert worker["resourceClaims"] == [{"name": "scratch", "resourceClaimTemplateName": "mine"}]


@pytest.mark.parametrize(
    ("dra", "path", "message"),
    [
        ({"roceCount": 0}, "infra.dra.roceCount", "must be at least 1"),
        ({"computeDomainNumNodes": -1}, "infra.dra.computeDomainNumNodes", "must be 0 (elastic) or more"),
        ({"autoCreate": "sometimes"}, "infra.dra.autoCreate", "expected true or false"),
        ({"roceCount": "eight"}, "infra.dra.roceCount", "integer"),
        (
            {"roce": 8},
            "infra.dra.roce",
            "unknown key (allowed: autoCreate, computeDomainNumNodes, roceCount)",
        ),
    ],
)
def test_a_bad_dra_value_is_refused_naming_the_key(
    infra_dict: dict[str, Any], dra: dict[str, Any], path: str, message: str
) -> None:
    """Each bad ``infra.dra`` value is one error naming its key and what is allowed."""
    infra_dict["dra"] = dra
    err = error(infra_dict)
    assert err.path == path
    assert message in err.message


def test_a_rendered_claim_cannot_also_name_a_claim(infra_dict: dict[str, Any]) -> None:
    """A well-known claim that names an existing ResourceClaim would end up with both fields
    (which the API server refuses): with autoCreate it is an error naming the claim; with
    autoCreate off it passes through as authored."""
    claims = [{"name": "roce-channel", "resourceClaimName": "admin-claim"}]
    err = error(with_claims(infra_dict, claims, group=1))
    assert err.path == "infra.kuberay.spec.workerGroupSpecs[1].template.spec.resourceClaims[0]"
    assert "drop resourceClaimName, or set infra.dra.autoCreate: false" in err.message
    infra = with_claims(infra_dict, claims, group=1)
    infra["dra"] = {"autoCreate": False}
    worker = render(infra)[-1]["spec"]["rayClusterSpec"]["workerGroupSpecs"][1]
    assert worker["template"]["spec"]["resourceClaims"] == claims


@pytest.mark.parametrize(
    ("claims", "suffix"), [("roce-channel", ""), ([{"resourceClaimTemplateName": "t"}], "[0]")]
)
def test_malformed_resource_claims_are_refused(infra_dict: dict[str, Any], claims: Any, suffix: str) -> None:
    """``resourceClaims`` must be a list of named claims; the error names the entry."""
    err = error(with_claims(infra_dict, claims))
    assert err.path == f"infra.kuberay.spec.workerGroupSpecs[0].template.spec.resourceClaims{suffix}"


def test_a_second_unnamed_group_is_still_refused(infra_dict: dict[str, Any]) -> None:
    """Beside a group named workers, a group that says nothing of its role is still an error:
    only the only group, or one named workers, is a plain Ray group."""
    groups = infra_dict["kuberay"]["spec"]["workerGroupSpecs"]
    groups[0]["groupName"] = "workers"
    groups[1]["groupName"] = "rollout"
    err = error(infra_dict)
    assert err.path == "infra.kuberay.spec.workerGroupSpecs[1]"
    assert "cannot tell the fleet role of worker group 'rollout'" in err.message


def test_a_single_group_keeps_an_explicit_role(infra_dict: dict[str, Any]) -> None:
    """The only worker group is tagged with the role it says, whatever its name."""
    groups = infra_dict["kuberay"]["spec"]["workerGroupSpecs"]
    del groups[1]
    groups[0]["groupName"] = "gpu"
    groups[0]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "DOCKYARD_FLEET_ROLE", "value": "inference"}
    ]
    (group,) = render(infra_dict)[-1]["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert "dockyard_fleet_inference" in group["rayStartParams"]["resources"]


def test_check_says_what_was_inferred(
    write: Write, cli_env: None, infra_dict: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """``check`` names each group's role and its source, a plain group, a missing fleet, and
    the DRA objects rendered for the claims (or the claims left as authored)."""
    groups = infra_dict["kuberay"]["spec"]["workerGroupSpecs"]
    groups[1]["groupName"] = "workers"
    groups[0]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "DOCKYARD_FLEET_ROLE", "value": "trainer"}
    ]
    infra = with_claims(infra_dict, CLAIMS)
    infra["dra"] = {"roceCount": 2}
    recipe = write("recipe.yaml", "grpo: {max_num_steps: 1}\n")
    path = write("run.infra.yaml", yaml.safe_dump(infra))
    assert main(["dockyard", "check", str(recipe), "--infra", str(path)]) == 0
    out = capsys.readouterr().out
    assert "  workers              role=none      replicas=1" in out
    assert (
        "inferred:\n"
        "  trainer: fleet role trainer (from DOCKYARD_FLEET_ROLE=trainer)\n"
        "  workers: a plain Ray worker group (named workers): no dockyard_fleet_* tag, no "
        "DOCKYARD_FLEET_ROLE\n"
        "  fleets: no inference worker group\n"
        "  dra: ComputeDomain/compute-domain-grpo (numNodes=0, elastic) for claim "
        "compute-domain-channel of trainer (template name rewritten)\n"
        "  dra: ResourceClaimTemplate/roce-grpo (2 RoCE NICs per pod) for claim roce-channel of "
        "trainer (template name rewritten)\n"
    ) in out
    assert (
        "  5. ComputeDomain/compute-domain-grpo\n  6. ResourceClaimTemplate/roce-grpo\n  7. RayJob/grpo"
        in out
    )

    infra["dra"] = {"autoCreate": False}
    path.write_text(yaml.safe_dump(infra))
    assert main(["dockyard", "check", str(recipe), "--infra", str(path)]) == 0
    out = capsys.readouterr().out
    assert "  dra: autoCreate off: claims compute-domain-channel, roce-channel left as authored" in out
    assert "ComputeDomain/" not in out
