"""The Helm chart (charts/nymph) renders what the kustomize manifests deploy: its default render is
manifests/base object by object (the same RBAC rules, the same pod security settings, the same
probes and arguments), its PostgreSQL render the ha overlay's queue, so the two cannot drift
apart; its values change what they say, and its schema refuses a wrong type at install time."""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import pytest

from tests.support.helm import CHART, HELM_LABELS, run_helm, template
from tests.support.incluster import REPO, kustomize, one_of

Key = tuple[str, str, str]
KEPT = {("Namespace", "", "nymph-system"), ("PersistentVolumeClaim", "nymph-system", "nymph-queue-data")}


def key(doc: dict[str, Any]) -> Key:
    return doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"]


def without_helm(doc: dict[str, Any]) -> dict[str, Any]:
    """The object as kustomize would write it: without Helm's labels and resource policy."""
    doc = copy.deepcopy(doc)
    meta = doc["metadata"]
    for label in HELM_LABELS:
        meta["labels"].pop(label)
    annotations = meta.get("annotations", {})
    assert (annotations.pop("helm.sh/resource-policy", None) == "keep") == (key(doc) in KEPT), key(doc)
    if not annotations:
        meta.pop("annotations", None)
    return doc


def by_key(docs: list[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    out = {key(d): d for d in docs}
    assert len(out) == len(docs), "two objects of one kind and name"
    return out


def test_chart_lints(helm: Path) -> None:
    res = run_helm(helm, "lint", "--strict", str(CHART))
    assert "1 chart(s) linted, 0 chart(s) failed" in res.stdout, res.stdout


def test_default_render_is_the_kustomize_base_object_by_object(helm: Path) -> None:
    chart = by_key(template(helm))
    base = by_key(kustomize(REPO / "manifests" / "base"))
    # The token Secret: the base has the operator make it by hand, the chart makes a random one.
    secret = chart.pop(("Secret", "nymph-system", "nymph-daemon-token"))
    assert base64.b64decode(secret["data"]["token"]).decode().startswith("nyq_")
    # The served namespace's labels: Helm does not take over an object it did not create (and
    # `default` always exists), so the chart leaves labelling it to the operator (NOTES.txt).
    served = base.pop(("Namespace", "", "default"))
    assert served["metadata"]["labels"]["nymph.io/served"] == "true"
    assert set(chart) == set(base)
    for k, doc in chart.items():
        assert without_helm(doc) == base[k], k


def test_postgresql_render_is_the_ha_overlays_queue(helm: Path) -> None:
    chart = template(
        helm,
        "--set=queue.backend=postgresql",
        "--set=queue.replicas=3",
        "--set=secretStore.keySecret.name=nymph-queue-secret-key",
    )
    ha = kustomize(REPO / "manifests" / "overlays" / "ha")
    assert sorted(key(d) for d in chart if d["kind"] != "Secret") == sorted(
        key(d) for d in ha if key(d) != ("Namespace", "", "default")
    )
    assert without_helm(one_of(chart, "PodDisruptionBudget")) == one_of(ha, "PodDisruptionBudget")

    def queue(docs: list[dict[str, Any]]) -> dict[str, Any]:
        dep = one_of(docs, "Deployment")
        pod = dep["spec"]["template"]["spec"]
        c = pod["containers"][0]
        for named in (pod["volumes"], c["volumeMounts"]):  # a strategic merge reorders these
            named.sort(key=lambda v: v["name"])
        return dep

    assert without_helm(queue(chart)) == queue(ha)


def test_values_change_what_they_say(helm: Path) -> None:
    docs = template(
        helm,
        "--set=servedNamespaces={team-a,team-b}",
        "--set=daemon.dockyardRole=false",
        "--set=daemon.workdirRoot=/srv/nymph",
        "--set=daemon.tolerations[0].key=nvidia.com/gpu,daemon.tolerations[0].operator=Exists",
        "--set=image.repository=registry.example/nymph,image.tag=1.2.3",
        "--set=daemonToken.existingSecret=my-token",
        "--set=secretStore.keySecret.name=my-key",
        "--set-string=extraLabels.team=ml,extraAnnotations.owner=ops,podLabels.tier=infra",
        "--set=queue.resources.limits.memory=1Gi",
    )
    roles = sorted(
        (d["kind"], d["metadata"]["namespace"], d["metadata"]["name"])
        for d in docs
        if "Role" in d["kind"] and "namespace" in d["metadata"]
    )
    assert roles == [
        ("Role", "team-a", "nymph-daemon"),
        ("Role", "team-b", "nymph-daemon"),
        ("RoleBinding", "team-a", "nymph-daemon"),
        ("RoleBinding", "team-b", "nymph-daemon"),
    ]
    assert not [d for d in docs if d["kind"] == "Secret"]  # the operator's own token Secret
    ds = one_of(docs, "DaemonSet")["spec"]["template"]
    c = ds["spec"]["containers"][0]
    assert [a for a in c["args"] if a.startswith(("--namespace", "--workdir-root"))] == [
        "--namespace=team-a",
        "--namespace=team-b",
        "--workdir-root=/srv/nymph",
    ]
    assert ds["spec"]["volumes"][0]["hostPath"]["path"] == c["volumeMounts"][0]["mountPath"] == "/srv/nymph"
    assert ds["spec"]["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    assert c["env"][1]["valueFrom"]["secretKeyRef"] == {"name": "my-token", "key": "token"}
    assert ds["metadata"]["labels"]["tier"] == "infra"
    queue = one_of(docs, "Deployment")["spec"]["template"]["spec"]
    q = queue["containers"][0]
    assert "--secret-key-file=/etc/nymph/secret-key/key" in q["args"]
    assert {"name": "secret-key", "secret": {"secretName": "my-key", "defaultMode": 0o400}} in queue[
        "volumes"
    ]
    assert {"name": "daemon-token", "secret": {"secretName": "my-token"}} in queue["volumes"]
    assert q["resources"]["limits"]["memory"] == "1Gi"
    assert c["image"] == q["image"] == "registry.example/nymph:1.2.3"
    for d in docs:
        assert d["metadata"]["labels"]["team"] == "ml", key(d)
        assert d["metadata"]["annotations"]["owner"] == "ops", key(d)


@pytest.mark.parametrize(
    ("value", "refused"),
    [
        ("queue.replicas=two", "at '/queue/replicas': got string, want integer"),
        ("queue.replicas=3", "at '/queue/replicas': value must be 1"),  # one SQLite file, one writer
        ("queue.backend=postgresql", "at '/secretStore/keySecret/name'"),  # every replica needs one key
        ("servedNamespaces=default", "at '/servedNamespaces': got string, want array"),
        ("daemon.dockyardRole=maybe", "at '/daemon/dockyardRole': got string, want boolean"),
        ("image.pullPolicy=Sometimes", "at '/image/pullPolicy'"),
        ("extraLabels.team=1", "at '/extraLabels/team': got number, want string"),
        ("daemon.workdirRoot=relative/path", "at '/daemon/workdirRoot'"),
        ("queue.frobnicate=1", "additional properties 'frobnicate' not allowed"),
    ],
)
def test_schema_refuses_a_wrong_value(helm: Path, value: str, refused: str) -> None:
    res = run_helm(helm, "template", "nymph", str(CHART), f"--set={value}", check=False)
    assert res.returncode != 0 and refused in res.stderr, res.stderr
