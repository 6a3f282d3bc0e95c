"""The pure parts of ``run``: the run-mode macro, the RayJob flags, the working-dir package,
run handles and the exec submitter's script."""

from __future__ import annotations

import io
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest

from nymph.dockyard.errors import DockyardLiveError
from nymph.dockyard.live import execrun, handles, workdir
from nymph.dockyard.render import runopts
from nymph.dockyard.render.manifests import render_manifests
from nymph.dockyard.render.runopts import RunFlags
from nymph.dockyard.spec.enums import CodeSource, RunMode, SubmitterMode
from nymph.dockyard.spec.parse import parse_infra


def infra(infra_dict: dict[str, Any], **launch: Any) -> Any:
    infra_dict["launch"] = {**infra_dict["launch"], **launch}
    return parse_infra(infra_dict)


def test_interactive_is_port_forward_upload_and_wait(infra_dict: dict[str, Any]) -> None:
    choice = runopts.resolve(infra(infra_dict), RunFlags())
    assert (choice.run_mode, choice.submitter, choice.code_source, choice.wait) == (
        RunMode.INTERACTIVE, SubmitterMode.PORT_FORWARD, CodeSource.UPLOAD, True,
    )  # fmt: skip


def test_batch_is_exec_image_and_no_wait(infra_dict: dict[str, Any]) -> None:
    cfg = infra(infra_dict, codePath="/opt/code")
    choice = runopts.resolve(cfg, RunFlags(mode=RunMode.BATCH))
    assert (choice.submitter, choice.code_source, choice.code_path, choice.wait) == (
        SubmitterMode.EXEC, CodeSource.IMAGE, "/opt/code", False,
    )  # fmt: skip
    assert runopts.resolve(infra(infra_dict, runMode="batch", codePath="/c"), RunFlags()).wait is False


def test_flags_win_over_the_macro_and_the_infra(infra_dict: dict[str, Any]) -> None:
    cfg = infra(infra_dict, runMode="batch", codePath="/c")
    flags = RunFlags(submitter=SubmitterMode.PORT_FORWARD, code_source=CodeSource.LUSTRE, wait=True)
    choice = runopts.resolve(cfg, flags)
    assert (choice.submitter, choice.code_source, choice.wait) == (
        SubmitterMode.PORT_FORWARD, CodeSource.LUSTRE, True,
    )  # fmt: skip


def test_infra_settings_win_over_its_run_mode_default(infra_dict: dict[str, Any]) -> None:
    cfg = infra(infra_dict, codeSource="lustre", codePath="/lustre/code")
    assert runopts.resolve(cfg, RunFlags()).code_source is CodeSource.LUSTRE
    # --mode on the command line: its defaults win over the infra's
    assert runopts.resolve(cfg, RunFlags(mode=RunMode.BATCH)).code_source is CodeSource.IMAGE


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (RunFlags(code_source=CodeSource.IMAGE), "needs --code-path"),
        (RunFlags(submitter=SubmitterMode.EXEC), "cannot upload the working dir"),
    ],
)
def test_impossible_choices(infra_dict: dict[str, Any], flags: RunFlags, needle: str) -> None:
    with pytest.raises(DockyardLiveError, match=needle):
        runopts.resolve(infra(infra_dict), flags)


def test_rayjob_flags(infra_dict: dict[str, Any]) -> None:
    manifests = render_manifests(infra=parse_infra(infra_dict))
    out = runopts.rayjob_options(manifests, name="try-2", shutdown=False, ttl=60)
    job = out[-1]
    assert (job["metadata"]["name"], job["spec"]["shutdownAfterJobFinishes"], job["spec"]["ttlSecondsAfterFinished"]) == (
        "try-2", False, 60,
    )  # fmt: skip
    assert manifests[-1]["metadata"]["name"] != "try-2"  # a copy
    with pytest.raises(DockyardLiveError, match="--ttl"):
        runopts.rayjob_options(manifests, ttl=-1)


def test_run_ids() -> None:
    assert (
        runopts.default_run_id(user="jo", recipe="GRPO SWE", now=0, salt="ab")
        == "jo-grpo-swe-19700101-000000-ab"
    )
    assert runopts.check_run_id("try-2.b_c") == "try-2.b_c"
    with pytest.raises(DockyardLiveError):
        runopts.check_run_id("../x")


# -- the working-dir package ---------------------------------------------------------------------


def test_package_takes_the_upload_paths_without_caches(tmp_path: Path) -> None:
    (tmp_path / "utils" / "__pycache__").mkdir(parents=True)
    (tmp_path / "utils" / "a.py").write_text("x = 1\n")
    (tmp_path / "utils" / "a.pyc").write_bytes(b"\0")
    (tmp_path / "utils" / "__pycache__" / "a.cpython.pyc").write_bytes(b"\0")
    (tmp_path / "utils" / ".gitignore").write_text("*\n")
    (tmp_path / "secret-notes.txt").write_text("not packaged\n")
    (tmp_path / "pyproject.toml").write_text("[project]\n")
    pkg = workdir.package(tmp_path, extra={workdir.STAGED_RECIPE: "grpo: {}\n"})
    names = sorted(zipfile.ZipFile(io.BytesIO(pkg.data)).namelist())
    assert names == ["dockyard_run.yaml", "pyproject.toml", "utils/a.py"]
    assert pkg.files == 3
    assert pkg.uri.startswith("gcs://_ray_pkg_") and pkg.uri.endswith(".zip")
    assert workdir.package(tmp_path, extra={workdir.STAGED_RECIPE: "grpo: {}\n"}).uri == pkg.uri  # stable


def test_package_refuses_paths_outside_and_over_the_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(DockyardLiveError, match="inside --repo-root"):
        workdir.package(tmp_path, include=["../etc"])
    (tmp_path / "big.bin").write_bytes(b"x" * 2048)
    monkeypatch.setattr(workdir, "MAX_PACKAGE_BYTES", 1024)
    with pytest.raises(DockyardLiveError, match="100 MiB upload limit"):
        workdir.package(tmp_path, include=["big.bin"])


# -- run handles -----------------------------------------------------------------------------------


def test_handles_round_trip_and_latest_by_recipe(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("a: 1\n")
    first = handles.new(run_id="a-1", kind="rest", cluster="c", namespace="ns", recipe=recipe)
    second = handles.new(
        run_id="a-2", kind="exec", cluster="c", namespace="ns", recipe=recipe, pod="p", run_dir="/tmp/x"
    )
    handles.save(first, directory=tmp_path)
    handles.save(second, directory=tmp_path)
    assert handles.load("a-1", directory=tmp_path) == first
    assert handles.load("../a-1", directory=tmp_path) is None
    latest = handles.latest_for_recipe(recipe, directory=tmp_path)
    assert latest is not None and latest.run_id == ("a-2" if second.created >= first.created else "a-1")
    assert handles.latest_for_recipe(tmp_path / "other.yaml", directory=tmp_path) is None


# -- the exec submitter's script -------------------------------------------------------------------


def test_exec_script_runs_detached_in_code_path_with_env(tmp_path: Path) -> None:
    code = tmp_path / "code dir"
    code.mkdir()
    (code / "marker").write_text("here\n")
    directory = str(tmp_path / "run")
    script = execrun.start_script(
        directory=directory,
        entrypoint='cat marker; echo "id=$DOCKYARD_K8S_RUN_ID"; exit 3',
        env={"DOCKYARD_K8S_RUN_ID": "r-1 'quoted'"},
        code_path=str(code),
    )
    subprocess.run(["sh", "-c", script], check=True, timeout=30)
    exit_file = Path(directory) / "exit"
    for _ in range(200):
        if exit_file.exists() and exit_file.read_text().strip():
            break
        subprocess.run(["sleep", "0.05"], check=True)
    assert exit_file.read_text().strip() == "3"
    assert (Path(directory) / "out.log").read_text() == "here\nid=r-1 'quoted'\n"
    assert (Path(directory) / "pid").read_text().strip().isdigit()


def test_a_taken_local_port_is_seen() -> None:
    import socket

    from nymph.dockyard.live.endpoint import port_free

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert port_free(taken.getsockname()[1]) is False


# -- submit.kind: rayjob ------------------------------------------------------------------------


def test_submit_kind_rayjob_excludes_upload_exec_and_replace(infra_dict: dict[str, Any]) -> None:
    with pytest.raises(DockyardLiveError, match="cannot upload the working dir"):
        runopts.check_rayjob_kind(runopts.resolve(infra(infra_dict), RunFlags()), replace=False)
    image = runopts.resolve(infra(infra_dict, codeSource="image", codePath="/c"), RunFlags())
    runopts.check_rayjob_kind(image, replace=False)  # KubeRay can start it
    batch = runopts.resolve(infra(infra_dict, codePath="/c"), RunFlags(mode=RunMode.BATCH))
    with pytest.raises(DockyardLiveError, match="does not combine with the exec submitter"):
        runopts.check_rayjob_kind(batch, replace=False)
    with pytest.raises(DockyardLiveError, match="--replace .* needs submit.kind: sdk"):
        runopts.check_rayjob_kind(image, replace=True)


def test_cluster_rayjob_selects_the_existing_cluster() -> None:
    job = runopts.cluster_rayjob(
        run_id="Alice_GRPO.run-20260101",
        cluster="grpo",
        namespace="ns",
        entrypoint="cd /c && go",
        env={"A": "1"},
    )
    assert job["metadata"]["name"] == "alice-grpo-run-20260101"
    assert job["metadata"]["namespace"] == "ns"
    assert job["spec"]["clusterSelector"] == {"ray.io/cluster": "grpo"}
    assert "rayClusterSpec" not in job["spec"] and "shutdownAfterJobFinishes" not in job["spec"]
    assert job["spec"]["entrypoint"] == "cd /c && go"
    assert job["spec"]["runtimeEnvYAML"] == "env_vars:\n  A: '1'\n"


@pytest.mark.parametrize(
    ("run_id", "name"),
    [("9lives", "r9lives"), ("a" * 80, "a" * runopts.RAYJOB_NAME_MAX), ("x." + "-" * 60 + "y", "x")],
)
def test_rayjob_name_is_a_short_dns_label(run_id: str, name: str) -> None:
    assert runopts.rayjob_name(run_id) == name
