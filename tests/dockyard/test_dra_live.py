"""The DRA render against the real local API server (Kubernetes 1.36, resource.k8s.io/v1 built
in) with the KubeRay CRDs: the RoCE ResourceClaimTemplate and the Ray object whose workers
claim it pass a server-side dry run, a device count the server refuses is refused by the
infra schema first, and the daemon's dockyard Role is enough to apply and delete them.

The ComputeDomain is left out: its CRD is NVIDIA's DRA driver's, which this cluster does not
serve (its shape is compared with dockyard-k8s's render in test_upstream_golden.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from nymph.dockyard.errors import DockyardConfigError
from nymph.dockyard.render import dra
from nymph.dockyard.render.manifests import render_manifests
from nymph.dockyard.render.task import DOCKYARD_ROLE_RULES, dockyard_task_manifests
from nymph.dockyard.spec.parse import parse_infra
from nymph.localcluster import LocalCluster
from nymph.localcluster.cluster import kubectl_path
from tests.support.kube_fixtures import SaKubeconfig

pytestmark = pytest.mark.e2e

GOLDEN = Path(__file__).resolve().parent / "golden"


def dry_run(kube: LocalCluster, namespace: str, manifests: list[Any]) -> tuple[int, list[str], str]:
    """``kubectl apply --server-side --dry-run=server``: exit code, accepted Kind/name, stderr."""
    proc = kube.kubectl(
        "apply", "--server-side", "--dry-run=server", "--field-manager=nymph", "-n", namespace, "-o", "json",
        "-f", "-", input=yaml.safe_dump_all(manifests, sort_keys=False), check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        return proc.returncode, [], proc.stderr
    doc = json.loads(proc.stdout)
    items = doc["items"] if doc.get("kind") == "List" else [doc]
    return 0, [f"{i['kind']}/{i['metadata']['name']}" for i in items], ""


def test_the_claim_template_and_the_claiming_workers_pass_server_dry_run(
    kube: LocalCluster, kuberay_crds: Path, namespace: str
) -> None:
    """Every rendered object but the ComputeDomain is accepted as rendered: the RoCE
    ResourceClaimTemplate by resource.k8s.io/v1, the RayJob with its workers' rewritten
    claims by the KubeRay CRD."""
    infra = yaml.safe_load((GOLDEN / "dra-rayjob.infra.yaml").read_text(encoding="utf-8"))
    infra["namespace"] = namespace
    manifests = [m for m in render_manifests(infra=parse_infra(infra)) if m["kind"] != "ComputeDomain"]
    expected = [f"{m['kind']}/{m['metadata']['name']}" for m in manifests]
    assert "ResourceClaimTemplate/roce-grpo" in expected
    assert dry_run(kube, namespace, manifests) == (0, expected, "")


def test_a_count_the_api_server_refuses_is_refused_at_check(kube: LocalCluster, namespace: str) -> None:
    """The API server refuses a RoCE template asking for a negative number of devices; the
    schema refuses it first, naming the key, and refuses 0 too (which the server would read
    as unset, one device, not the count the infra asked for)."""
    template = dra.roce_template("roce-bad", namespace=namespace, count=-1)
    code, _, err = dry_run(kube, namespace, [template])
    assert code != 0
    assert "exactly.count" in err and "must be greater than zero" in err
    for count in (-1, 0):
        with pytest.raises(DockyardConfigError) as info:
            parse_infra({"namespace": namespace, "image": "i", "dra": {"roceCount": count}})
        assert (info.value.path, info.value.message) == ("infra.dra.roceCount", "must be at least 1")


def test_the_daemons_role_applies_and_deletes_the_dra_objects(
    kube: LocalCluster, kuberay_crds: Path, namespace: str, sa_kubeconfig: SaKubeconfig
) -> None:
    """As an account holding only the dockyard Role rules, a dispatched task's objects with the
    RoCE template are applied (twice: idempotent) and deleted; the ComputeDomain is granted
    the same verbs (its kind is not served here, so the grant is read from the authorizer)."""
    infra = yaml.safe_load((GOLDEN / "dra-rayjob.infra.yaml").read_text(encoding="utf-8"))
    infra["namespace"] = namespace
    manifests = dockyard_task_manifests(recipe={"grpo": {}}, infra=infra, overrides=[], namespace=namespace)
    assert [m["kind"] for m in manifests].count("ComputeDomain") == 1
    stream = yaml.safe_dump_all([m for m in manifests if m["kind"] != "ComputeDomain"], sort_keys=False)
    restricted = sa_kubeconfig(namespace=namespace, rules=DOCKYARD_ROLE_RULES, name="dispatcher")

    def as_daemon(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [kubectl_path(), f"--kubeconfig={restricted}", "-n", namespace, *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    for _ in range(2):
        applied = as_daemon("apply", "--server-side", "--field-manager=nymph", "-f", "-", stdin=stream)
        assert applied.returncode == 0, applied.stderr
        assert "resourceclaimtemplate.resource.k8s.io/roce-grpo serverside-applied" in applied.stdout
    deleted = as_daemon("delete", "-f", "-", "--wait=false", stdin=stream)
    assert deleted.returncode == 0, deleted.stderr
    assert 'resourceclaimtemplate.resource.k8s.io "roce-grpo" deleted' in deleted.stdout

    def allowed(verb: str, group: str, resource: str) -> bool:
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {
                "resourceAttributes": {
                    "namespace": namespace,
                    "verb": verb,
                    "group": group,
                    "resource": resource,
                }
            },
        }
        answer = as_daemon("create", "--validate=false", "-o", "json", "-f", "-", stdin=json.dumps(review))
        assert answer.returncode == 0, answer.stderr
        return bool(json.loads(answer.stdout)["status"].get("allowed"))

    for verb in ("get", "create", "patch", "delete"):
        assert allowed(verb, "resource.nvidia.com", "computedomains"), verb
    assert not allowed("list", "resource.nvidia.com", "computedomains")
    assert not allowed("create", "resource.k8s.io", "resourceclaims")
