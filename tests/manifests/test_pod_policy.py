"""The optional pod-policy component on a real API server: in a namespace labelled as served,
the cluster itself refuses a Pod with any hostPath but one nymph workdir; elsewhere it does not
interfere. And the served namespace is labelled for Pod Security in warn and audit mode only."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from nymph.errors import NymphError
from nymph.localcluster import LocalCluster
from nymph.localcluster.cluster import kubectl_path
from tests.support.harness import REPO
from tests.support.kube_fixtures import new_namespace

COMPONENT = REPO / "manifests" / "components" / "pod-policy"


def pod(namespace: str, host_path: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "lakeshore-0123abcd", "namespace": namespace},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {"name": "user", "image": "busybox", "volumeMounts": [{"name": "w", "mountPath": "/w"}]}
            ],
            "volumes": [{"name": "w", "hostPath": {"path": host_path, "type": "Directory"}}],
        },
    }


def dry_create(kube: LocalCluster, body: dict[str, Any]) -> str | None:
    """None when the API server would create the Pod, else its refusal."""
    ns = body["metadata"]["namespace"]
    try:
        kube.api("POST", f"/api/v1/namespaces/{ns}/pods?dryRun=All", body)
    except NymphError as exc:
        return str(exc)
    return None


def test_an_overlay_with_the_component_renders_the_policy(tmp_path: Path) -> None:
    """The component adds the policy and its binding to an overlay of the base."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                # kustomize takes relative paths only
                "resources": [os.path.relpath(REPO / "manifests" / "base", overlay)],
                "components": [os.path.relpath(COMPONENT, overlay)],
            }
        )
    )
    out = subprocess.run(
        [kubectl_path(), "kustomize", "--load-restrictor=LoadRestrictionsNone", str(overlay)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    kinds = {d["kind"] for d in docs}
    assert {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "DaemonSet"} <= kinds
    served = next(d for d in docs if d["kind"] == "Namespace" and d["metadata"]["name"] == "default")
    labels = served["metadata"]["labels"]
    assert (
        labels["pod-security.kubernetes.io/warn"] == labels["pod-security.kubernetes.io/audit"] == "baseline"
    )
    assert "pod-security.kubernetes.io/enforce" not in labels  # baseline forbids the workdir itself


def test_the_cluster_refuses_other_hostpaths_in_served_namespaces(kube: LocalCluster) -> None:
    """With the policy applied, a Pod mounting ``/`` (or a path that only starts like a
    workdir) is refused in a served namespace; one workdir is accepted; an unlabelled namespace
    is left alone. The policy is removed afterwards."""
    served = new_namespace(kube)
    kube.api(
        "PATCH",
        f"/api/v1/namespaces/{served}",
        {"metadata": {"labels": {"nymph.io/served": "true"}}},
        content_type="application/merge-patch+json",
    )
    other = new_namespace(kube)
    docs = list(yaml.safe_load_all((COMPONENT / "hostpath-policy.yaml").read_text()))
    kube.kubectl(
        "apply", "--server-side", "--field-manager=nymph-tests", "-f", "-", input=yaml.safe_dump_all(docs)
    )
    try:
        refusal = None
        deadline = time.monotonic() + 30
        while refusal is None and time.monotonic() < deadline:  # the policy takes a moment to load
            refusal = dry_create(kube, pod(served, "/"))
            if refusal is None:
                time.sleep(0.3)
        assert refusal is not None and "hostPath volumes are not allowed" in refusal
        for bad in ("/var/lib/nymph", "/var/lib/nymph/work/lakeshore-0123abcd/../../..", "/etc"):
            assert dry_create(kube, pod(served, bad)) is not None, bad
        assert dry_create(kube, pod(served, "/var/lib/nymph/work/lakeshore-0123abcd")) is None
        assert dry_create(kube, pod(other, "/")) is None
    finally:
        for d in reversed(docs):
            kube.kubectl(
                "delete",
                d["kind"].lower() + ".admissionregistration.k8s.io",
                d["metadata"]["name"],
                "--wait=false",
            )
    left = kube.kubectl("get", "validatingadmissionpolicies", "-o", "json").stdout
    assert "nymph-hostpath-workdir-only" not in json.dumps(json.loads(left)["items"])
