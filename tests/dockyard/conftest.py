"""Shared fixtures for the dockyard tests: isolated environments, file writers, strict
schema validation of rendered manifests (kubernetes-validate for core kinds, the KubeRay CRD
openAPIV3Schema for RayJob / RayCluster), and ``ray_head``: a real local Ray head for the
Jobs REST API tests (the real-cluster fixtures are in tests/support/kube_fixtures.py)."""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import kubernetes_validate
import pytest
import yaml

from nymph.dockyard.render.k8s import Manifest
from nymph.dockyard.spec.load import Environment

ROOT = Path(__file__).resolve().parents[2]


def _crd_dir() -> Path:
    """The KubeRay CRDs (NYMPH_KUBERAY_CRDS, ../shared/crds/kuberay, or /work/shared/...)."""
    from tests.support.kube_fixtures import kuberay_crd_dir

    found = kuberay_crd_dir()
    if found is None:
        msg = "KubeRay CRDs not found: set NYMPH_KUBERAY_CRDS to the folder holding ray.io_rayjobs.yaml"
        if os.environ.get("NYMPH_E2E", "").lower() == "require":
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    return found


EXAMPLES = ROOT / "manifests" / "examples"
K8S_VERSION = "1.37.0"


@pytest.fixture
def env(tmp_path: Path) -> Environment:
    """No user defaults, no kubeconfig, no service account: namespace falls to 'default'."""
    home = tmp_path / "home"
    home.mkdir()
    return Environment(
        env={},
        home=home,
        user="tester",
        kubeconfigs=(),
        sa_namespace_path=tmp_path / "no-service-account",
    )


@pytest.fixture
def write(tmp_path: Path) -> Callable[[str, str], Path]:
    def _write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
        return path

    return _write


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Make ``Environment.from_process()`` hermetic for CLI tests."""
    home = tmp_path / "cli-home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    monkeypatch.setenv("DOCKYARD_K8S_USER", "tester")
    monkeypatch.delenv("DOCKYARD_K8S_DEFAULTS", raising=False)


# -- schema validation ---------------------------------------------------------------------


def _strict(schema: Any) -> Any:
    """Reject unknown fields like ``kubectl apply --validate=strict`` does."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if (
            out.get("type") == "object"
            and "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@functools.cache
def _crd_validator(kind: str) -> Any:
    path = _crd_dir() / f"ray.io_{kind.lower()}s.yaml"
    crd = yaml.safe_load(path.read_text(encoding="utf-8"))
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    schema = _strict(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    return cls(schema)


def _check_metadata(manifest: Manifest) -> None:
    meta = manifest["metadata"]
    assert set(meta) <= {"name", "namespace", "labels", "annotations"}, meta
    for key in ("labels", "annotations"):
        for k, v in (meta.get(key) or {}).items():  # type: ignore[attr-defined]
            assert isinstance(k, str) and isinstance(v, str), (key, k, v)


def validate_manifest(manifest: Manifest) -> None:
    """Strict offline validation; raises on any schema violation."""
    _check_metadata(manifest)
    if manifest["apiVersion"] == "ray.io/v1":
        errors = sorted(_crd_validator(manifest["kind"]).iter_errors(manifest), key=lambda e: list(e.path))
        assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors[:5])
    else:
        kubernetes_validate.validate(dict(manifest), K8S_VERSION, strict=True)


@pytest.fixture
def validate() -> Callable[[Manifest], None]:
    return validate_manifest


def minimal_infra() -> dict[str, Any]:
    """A small valid infra body: rayjob mode, a trainer + inference cluster, a sandbox."""

    def group(name: str, replicas: int) -> dict[str, Any]:
        return {
            "groupName": name,
            "replicas": replicas,
            "rayStartParams": {"num-gpus": "8"},
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "ray-worker",
                            "resources": {"limits": {"nvidia.com/gpu": "8"}},
                        }
                    ]
                }
            },
        }

    return {
        "namespace": "team-a",
        "image": "dockyard/ubuntu-swe:1",
        "launch": {"mode": "rayjob", "entrypoint": "python3 -u train.py"},
        "sandbox": {"name": "sbx", "replicas": 2, "port": 9090},
        "kuberay": {
            "name": "grpo",
            "spec": {
                "headGroupSpec": {
                    "rayStartParams": {},
                    "template": {"spec": {"containers": [{"name": "ray-head"}]}},
                },
                "workerGroupSpecs": [group("trainer", 2), group("inference", 1)],
            },
        },
    }


@pytest.fixture
def infra_dict() -> dict[str, Any]:
    return minimal_infra()


# -- a real local Ray head -----------------------------------------------------------------


def _ray_unavailable(message: str) -> None:
    if os.environ.get("NYMPH_E2E", "auto").strip().lower() == "require":
        pytest.fail(f"NYMPH_E2E=require but {message}", pytrace=False)
    pytest.skip(message)


def _ray_ports() -> list[str]:
    """A free 127.0.0.1 port for each of the head's listeners, all different: they are bound at
    once (a port picked and released one at a time can come back for the next listener, and
    Ray refuses to start with two components on one port)."""
    names = (
        "port",
        "dashboard-port",
        "dashboard-agent-listen-port",
        "dashboard-agent-grpc-port",
        "runtime-env-agent-port",
        "metrics-export-port",
        "ray-client-server-port",
        "node-manager-port",
        "object-manager-port",
    )
    with contextlib.ExitStack() as held:
        socks = [held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in names]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        ports = [int(sock.getsockname()[1]) for sock in socks]
    assert len(set(ports)) == len(ports)
    return [f"--{n}={port}" for n, port in zip(names, ports, strict=True)]


RAY_MARK = "NYMPH_TEST_RAY_HEAD"


def _marked(name: str, value: str) -> list[int]:
    """Processes whose environment has ``name=value``."""
    needle = f"{name}={value}".encode()
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            found.append(int(entry.name))
    return found


def _kill_marked(name: str, value: str) -> None:
    """``ray stop --force`` kills Ray's own processes, but a job's child (an entrypoint still
    running) can outlive them, orphaned: kill whatever still carries the head's mark."""
    deadline = time.monotonic() + 10
    while (pids := _marked(name, value)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


@pytest.fixture(scope="session")
def ray_head() -> Iterator[str]:
    """The dashboard URL of a Ray head started from the ``ray`` wheel (``ray[default]`` in the
    test extra): one CPU, no GPU, dashboard on 127.0.0.1. Stopped with ``ray stop --force``."""
    ray = Path(sys.executable).parent / "ray"
    if not ray.exists():
        _ray_unavailable(f"no {ray}: install the test extra (pip install -e '.[test]' brings ray[default])")
    temp = Path(tempfile.mkdtemp(prefix="nyray-", dir="/tmp"))  # short: Ray puts sockets under it
    env = {
        **os.environ,
        "PATH": f"{ray.parent}{os.pathsep}{os.environ.get('PATH', '')}",  # `python` is this venv's
        "RAY_USAGE_STATS_ENABLED": "0",
        # every process of this head (and of the jobs it runs) carries it: swept at the end
        RAY_MARK: str(temp),
    }
    ports = _ray_ports()
    dashboard = next(p for p in ports if p.startswith("--dashboard-port=")).split("=", 1)[1]
    argv = [
        str(ray),
        "start",
        "--head",
        "--node-ip-address=127.0.0.1",
        "--dashboard-host=127.0.0.1",
        "--num-cpus=1",
        "--num-gpus=0",
        "--object-store-memory=100000000",
        "--include-dashboard=true",
        "--disable-usage-stats",
        f"--temp-dir={temp}",
        *ports,
    ]
    started = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180, check=False)
    url = f"http://127.0.0.1:{dashboard}"
    try:
        if started.returncode != 0:
            tail = " | ".join((started.stderr or started.stdout).strip().splitlines()[-3:])
            _ray_unavailable(f"'ray start --head' failed (exit {started.returncode}): {tail}")
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/version", timeout=5) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                _ray_unavailable(f"the Ray dashboard at {url} did not answer within 90s (see {temp})")
            time.sleep(0.5)
        yield url
    finally:
        subprocess.run([str(ray), "stop", "--force"], env=env, capture_output=True, timeout=120, check=False)
        _kill_marked(RAY_MARK, str(temp))
        shutil.rmtree(temp, ignore_errors=True)
