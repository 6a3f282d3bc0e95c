from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from nymph.cli import main
from nymph.localcluster.cluster import kubectl_path

SPEC_DREAMRC = """\
providers:
  my-cluster: !providers.Kube
    context: prod-east
    namespace: lakeshore
modes:
  k8s-gpu:
    provider: my-cluster
    image: pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime
    resources:
      requests: {cpu: "4", memory: 16Gi}
      limits: {nvidia.com/gpu: 1, memory: 32Gi}
    node_selector:
      nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB
"""


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / ".dreamrc").write_text(SPEC_DREAMRC)
    (tmp_path / "train.py").write_text("print('EOF $(x)')\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_render_spec_example(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "render",
            "--mode",
            "k8s-gpu",
            "--script",
            "train.py",
            "--tag",
            "team=ml",
            "--instance-id",
            "lakeshore-00c0ffee",
        ]
    )
    assert code == 0
    pod = yaml.safe_load(capsys.readouterr().out)
    assert pod["metadata"]["name"] == "lakeshore-00c0ffee"
    assert pod["metadata"]["namespace"] == "lakeshore"
    assert pod["metadata"]["labels"]["lakeshore.provider"] == "my-cluster"
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_render_is_byte_identical_for_the_same_launch(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        "render",
        "--mode",
        "k8s-gpu",
        "--script",
        "train.py",
        "--instance-id",
        "lakeshore-00c0ffee",
        "-o",
        "json",
    ]
    main(args)
    first = capsys.readouterr().out
    main(args)
    assert capsys.readouterr().out == first
    assert json.loads(first)["kind"] == "Pod"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mode", "nope", "--script", "train.py"], "no mode named 'nope'"),
        (["--mode", "k8s-gpu", "--script", "missing.py"], "--script missing.py: no such file"),
        (["--mode", "k8s-gpu", "--script", "train.py", "--tag", "bad key=x"], "tags.bad key"),
        (["--mode", "k8s-gpu", "--script", "train.py", "--tag", "novalue"], "expected KEY=VALUE"),
        (["--mode", "k8s-gpu", "--script", "train.py", "--instance-id", "pod-1"], "not an instance id"),
        (["--mode", "k8s-gpu", "--script", "train.py", "--dreamrc", "nope.yaml"], "nope.yaml: no such file"),
    ],
)
def test_bad_input_is_one_clear_line_and_nonzero(
    workspace: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["render", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith("nymph: error:")
    assert message in err


def test_render_passes_strict_offline_schema_validation(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import kubernetes_validate

    main(
        [
            "render",
            "--mode",
            "k8s-gpu",
            "--script",
            "train.py",
            "--node",
            "node-1",
            "--workdir-root",
            "/var/lib/nymph",
        ]
    )
    pod = yaml.safe_load(capsys.readouterr().out)
    kubernetes_validate.validate(pod, "1.36", strict=True)
    pod["spec"]["containers"][0]["bogus"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, "1.36", strict=True)


def test_console_script_is_installed() -> None:
    assert shutil.which("nymph") or Path(kubectl_path()).with_name("nymph").exists()
