"""kubectl inside a Pod: the daemon's kubectl must reach the in-cluster ServiceAccount config,
which client-go uses only when no connection flag (even --request-timeout) is given."""

from __future__ import annotations

from pathlib import Path

import pytest

from nymph.kube.kubectl import Kubectl


@pytest.fixture
def pod_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    return tmp_path


def test_in_a_pod_kubectl_gets_no_connection_flags(pod_env: Path) -> None:
    argv = Kubectl(binary="kubectl")._argv(["get", "pods"])
    assert argv == ["kubectl", "get", "pods"]


def test_outside_a_pod_the_request_timeout_stays(pod_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert "--request-timeout=60s" in Kubectl(binary="kubectl", kubeconfig="/k")._argv(["get", "pods"])
    monkeypatch.setenv("KUBECONFIG", "/k")
    assert "--request-timeout=60s" in Kubectl(binary="kubectl")._argv(["get", "pods"])
    monkeypatch.delenv("KUBECONFIG")
    (pod_env / ".kube").mkdir()
    (pod_env / ".kube" / "config").write_text("{}")
    assert "--request-timeout=60s" in Kubectl(binary="kubectl")._argv(["get", "pods"])
    (pod_env / ".kube" / "config").unlink()
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    assert "--request-timeout=60s" in Kubectl(binary="kubectl")._argv(["get", "pods"])


async def test_kubectl_gets_a_writable_cache_dir_by_environment_not_by_flag(
    pod_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In the deployed Pod ``~/.kube/cache`` is on the read-only root: the daemon's kubectl
    caches discovery in a directory it can write, named in the environment (a --cache-dir
    flag would cost the in-cluster config)."""
    fake = tmp_path / "kubectl"
    fake.write_text('#!/bin/sh\necho "$KUBECACHEDIR|$*"\n')
    fake.chmod(0o755)
    cache = str(tmp_path / "state" / "kubectl-cache")
    res = await Kubectl(binary=str(fake), cache_dir=cache).run(["get", "pods"])
    assert res.stdout.strip() == f"{cache}|get pods"
    monkeypatch.setenv("KUBECACHEDIR", "/chosen")  # an operator's choice wins
    res = await Kubectl(binary=str(fake), cache_dir=cache).run(["get", "pods"])
    assert res.stdout.strip() == "/chosen|get pods"
    monkeypatch.delenv("KUBECACHEDIR")
    assert (await Kubectl(binary=str(fake)).run(["version"])).stdout.strip() == "|version"


async def test_kubectl_runs_without_garbage_collection_under_a_memory_limit_unless_told_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kubectl is a short-lived process: the daemon runs it with Go's collector off under a soft
    memory limit (less CPU per run); an operator's GOGC or GOMEMLIMIT is left as it is, and
    then neither is added."""
    monkeypatch.delenv("GOGC", raising=False)
    monkeypatch.delenv("GOMEMLIMIT", raising=False)
    fake = tmp_path / "kubectl"
    fake.write_text('#!/bin/sh\necho "${GOGC-unset}|${GOMEMLIMIT-unset}"\n')
    fake.chmod(0o755)
    assert (await Kubectl(binary=str(fake)).run(["version"])).stdout.strip() == "off|256MiB"
    monkeypatch.setenv("GOGC", "200")
    assert (await Kubectl(binary=str(fake)).run(["version"])).stdout.strip() == "200|unset"
    monkeypatch.delenv("GOGC")
    monkeypatch.setenv("GOMEMLIMIT", "1GiB")
    assert (await Kubectl(binary=str(fake)).run(["version"])).stdout.strip() == "unset|1GiB"
