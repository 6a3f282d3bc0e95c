"""``nymph dockyard render|check`` through ``nymph.cli.main``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from nymph.cli import main

Write = Callable[[str, str], Path]

RECIPE = "grpo:\n  max_num_steps: 100\n"

INFRA = """\
namespace: team-a
image: dockyard/img:1
scheduler: {kind: kai, queue: rl}
launch:
  mode: rayjob
  entrypoint: |
    set -eu
    python3 -u train.py
sandbox: {name: sbx, replicas: 3}
kuberay:
  name: grpo
  spec:
    headGroupSpec:
      template: {spec: {containers: [{name: head}]}}
    workerGroupSpecs:
      - {groupName: trainer, replicas: 2, template: {spec: {containers: [{name: w}]}}}
      - {groupName: inference, replicas: 1, template: {spec: {containers: [{name: w}]}}}
"""


@pytest.fixture
def files(write: Write, cli_env: None) -> tuple[Path, Path]:
    return write("recipe.yaml", RECIPE), write("run.infra.yaml", INFRA)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["dockyard", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_render_prints_multi_document_yaml(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    recipe, infra = files
    code, out, err = run(capsys, "render", str(recipe), "--infra", str(infra))
    assert (code, err) == (0, "")
    docs = list(yaml.safe_load_all(out))
    assert [f"{d['kind']}/{d['metadata']['name']}" for d in docs] == [
        "Deployment/sbx",
        "Service/sbx",
        "NetworkPolicy/sbx-netpol",
        "PodDisruptionBudget/sbx-pdb",
        "RayJob/grpo",
    ]
    assert docs[-1]["spec"]["entrypoint"] == "set -eu\npython3 -u train.py\n"


def test_render_is_byte_identical(files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    recipe, infra = files
    first = run(capsys, "render", str(recipe), "--infra", str(infra))[1]
    second = run(capsys, "render", str(recipe), "--infra", str(infra))[1]
    assert first == second


def test_overrides_before_and_after_options(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    recipe, infra = files
    code, out, _ = run(
        capsys,
        "render",
        str(recipe),
        "infra.sandbox.replicas=5",
        "--infra",
        str(infra),
        "infra.scheduler.queue=team-b",
        "infra.launch.mode=bringup",
    )
    assert code == 0
    docs = list(yaml.safe_load_all(out))
    assert docs[0]["spec"]["replicas"] == 5
    assert docs[-1]["kind"] == "RayCluster"
    assert docs[-1]["metadata"]["labels"]["kai.scheduler/queue"] == "team-b"


def test_check_summary(files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    recipe, infra = files
    code, out, err = run(capsys, "check", str(recipe), "--infra", str(infra))
    assert (code, err) == (0, "")
    assert "namespace:   team-a  (set in the infra)" in out
    assert "image:       dockyard/img:1" in out
    assert "scheduler:   kai  (queue=rl)" in out
    assert "  trainer              role=trainer   replicas=2" in out
    assert "  inference            role=inference replicas=1" in out
    assert "sandbox:     sbx  replicas=3  port=9090" in out
    assert "http://sbx.team-a.svc.cluster.local:9090  (injected as DOCKYARD_SANDBOX_URLS" in out
    assert "entrypoint:\n  set -eu\n  python3 -u train.py\n" in out
    assert "  5. RayJob/grpo" in out
    assert len(out.splitlines()) < 60


def test_check_summary_attach_mode(write: Write, cli_env: None, capsys: pytest.CaptureFixture[str]) -> None:
    recipe = write(
        "recipe.yaml",
        RECIPE + "infra:\n  namespace: ns\n  image: i\n  launch: {mode: attach, attach: shared}\n"
        "  sandbox: {}\n",
    )
    code, out, _ = run(capsys, "check", str(recipe))
    assert code == 0
    assert "attach to existing RayCluster shared" in out
    assert "not injected in attach mode" in out
    assert "  4. PodDisruptionBudget/dockyard-sandbox-pdb" in out


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_check_writes_the_resolved_bundle(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path, suffix: str
) -> None:
    recipe, infra = files
    target = tmp_path / f"bundle{suffix}"
    code, out, _ = run(capsys, "check", str(recipe), "--infra", str(infra), "-o", str(target))
    assert code == 0
    assert str(target) in out
    text = target.read_text()
    bundle = json.loads(text) if suffix == ".json" else yaml.safe_load(text)
    assert set(bundle) == {"sources", "infra", "recipe", "manifests"}
    assert bundle["recipe"] == {"grpo": {"max_num_steps": 100}}
    assert bundle["infra"]["sandbox"]["security"]["enabled"] is True  # defaults filled in
    assert bundle["infra"]["security"]["enabled"] is False
    assert bundle["infra"]["scheduler"] == {"kind": "kai", "queue": "rl"}
    assert [m["kind"] for m in bundle["manifests"]][-1] == "RayJob"


def test_errors_are_one_line_naming_file_path_and_allowed(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str], write: Write
) -> None:
    recipe, _ = files
    bad = write(
        "bad.infra.yaml",
        INFRA.replace("sandbox: {name: sbx, replicas: 3}", "sandbox: {name: sbx, replica: 3}"),
    )
    code, out, err = run(capsys, "check", str(recipe), "--infra", str(bad))
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith(f"nymph: error: {bad}: infra.sandbox.replica: unknown key (allowed: ")
    assert "replicas" in err


def test_render_time_errors_name_the_infra_file(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str], write: Write
) -> None:
    recipe, _ = files
    bad = write("bad.infra.yaml", INFRA.replace("groupName: inference", "groupName: rollout"))
    code, _, err = run(capsys, "render", str(recipe), "--infra", str(bad))
    assert code == 2
    assert err == (
        f"nymph: error: {bad}: infra.kuberay.spec.workerGroupSpecs[1]: cannot tell the fleet role "
        "of worker group 'rollout': name it trainer or inference (or trainer-*, inference-*), set "
        "DOCKYARD_FLEET_ROLE, or tag rayStartParams.resources with dockyard_fleet_<role> (a plain "
        "Ray worker group without a fleet is the only worker group, or is named workers)\n"
    )


def test_enum_error(files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    recipe, infra = files
    code, _, err = run(capsys, "render", str(recipe), "--infra", str(infra), "infra.launch.mode=later")
    assert code == 2
    assert err == (
        "nymph: error: override 'infra.launch.mode=later': infra.launch.mode: string 'later' is "
        "not allowed (allowed: rayjob, bringup, attach)\n"
    )


def test_missing_recipe(cli_env: None, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "render", str(tmp_path / "nope.yaml"))
    assert code == 2
    assert err == f"nymph: error: {tmp_path / 'nope.yaml'}: no such file\n"


def test_an_infra_file_given_as_the_recipe_is_named_as_such(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    recipe, infra = files
    code, _, err = run(capsys, "check", str(infra))
    assert code == 2 and "infra.image: required" in err
    assert (
        f"looks like an infra spec, not a recipe: give the recipe first and this file with --infra {infra}"
        in err
    )
    # a real recipe missing its infra gets no such hint
    code, _, err = run(capsys, "check", str(recipe))
    assert code == 2 and "looks like an infra spec" not in err


def test_unwritable_bundle(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    recipe, infra = files
    code, _, err = run(
        capsys, "check", str(recipe), "--infra", str(infra), "-o", str(tmp_path / "no" / "x.yaml")
    )
    assert code == 2
    assert "cannot write" in err


def test_dockyard_without_a_verb_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys)
    assert code == 2
    assert "render" in err and "check" in err
