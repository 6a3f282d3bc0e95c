from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nymph.errors import ValidationError
from nymph.launch.config import Mode, Provider
from nymph.launch.render import heredoc_command, heredoc_delimiter, render_pod, to_json, to_yaml, workdir_path
from nymph.launch.spec import LaunchSpec, build_launch_spec

IID = "lakeshore-0123abcd"


def spec(script: str = "print('hi')\n", **fields: Any) -> LaunchSpec:
    return build_launch_spec(
        provider=Provider(name="My Cluster", kwargs={"namespace": "lakeshore"}),
        mode=Mode(name="m", fields={"image": "python:3.12", **fields}),
        body={"script": script, "tags": {"team": "ml", "lakeshore.provider": "evil"}},
        instance_id=IID,
        owner_namespace="team-a",
    )


def test_pod_follows_the_contract() -> None:
    pod = render_pod(spec())
    assert pod["metadata"]["name"] == IID
    assert pod["metadata"]["namespace"] == "lakeshore"
    assert pod["metadata"]["labels"] == {
        "lakeshore": "true",
        "lakeshore.namespace": "team-a",
        "lakeshore.provider": "my-cluster",
        "team": "ml",
    }
    assert pod["spec"]["restartPolicy"] == "Never"
    (c,) = pod["spec"]["containers"]
    assert c["name"] == "user"
    assert c["command"] == ["/bin/sh", "-c"]
    assert "/tmp/u.py" in c["args"][0] and "python3 /tmp/u.py" in c["args"][0]
    assert "affinity" not in pod["spec"] and "volumes" not in pod["spec"]


def test_mode_fields_map_to_pod_fields() -> None:
    pod = render_pod(
        spec(
            resources={"limits": {"nvidia.com/gpu": 1}},
            env={"A": 1},
            node_selector={"gpu": "a100"},
            tolerations=[{"key": "g", "operator": "Exists"}],
            service_account="trainer",
            image_pull_secrets=["regcred"],
        )
    )
    s = pod["spec"]
    assert s["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 1}}
    assert {"name": "A", "value": "1"} in s["containers"][0]["env"]
    assert s["nodeSelector"] == {"gpu": "a100"}
    assert s["tolerations"] == [{"key": "g", "operator": "Exists"}]
    assert s["serviceAccountName"] == "trainer"
    assert s["imagePullSecrets"] == [{"name": "regcred"}]


def test_daemon_path_pins_node_and_mounts_workdir() -> None:
    pod = render_pod(spec(), node="node-a", workdir_root="/var/lib/nymph/")
    term = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ][0]
    assert term["matchExpressions"] == [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-a"]}
    ]
    (vol,) = pod["spec"]["volumes"]
    assert vol["hostPath"] == {"path": f"/var/lib/nymph/work/{IID}", "type": "Directory"}
    c = pod["spec"]["containers"][0]
    assert c["volumeMounts"] == [{"name": "workdir", "mountPath": "/workdir"}]
    assert {"name": "NYMPH_WORKDIR", "value": "/workdir"} in c["env"]


@pytest.mark.parametrize("root", ["relative/path", "/"])
def test_workdir_root_must_be_absolute_and_not_slash(root: str) -> None:
    with pytest.raises(ValidationError):
        workdir_path(root, IID)


def test_workdir_never_built_from_unchecked_ids() -> None:
    with pytest.raises(ValidationError):
        workdir_path("/var/lib/nymph", "../../etc")


def test_render_is_deterministic_byte_for_byte() -> None:
    a = spec(env={"B": 1, "A": 2}, node_selector={"z": "1", "a": "2"})
    b = spec(env={"B": 1, "A": 2}, node_selector={"z": "1", "a": "2"})
    for fmt in (to_yaml, to_json):
        assert fmt(render_pod(a, node="n", workdir_root="/w")) == fmt(
            render_pod(b, node="n", workdir_root="/w")
        )


ADVERSARIAL = [
    "print('EOF')\nEOF\n'EOF'\n",
    "x = '$(rm -rf /)' + `whoami`\nprint(x)\n",
    'print("$HOME ${PATH} \\\\n \\\\")\n',
    "no trailing newline",
    "print(1)\r\nprint(2)\r\n",
    "s = '''\n\tindented\n  '''\n",
    "print('ünïcödé ✓ 漢字')\n",
    # dash drops the first byte of a non-ASCII character right after a partial delimiter match
    "N\u00e9 = 1\nNYMPH\u00e9\nA\u20ac\nANYMPH_\u00ff\nB\u00e9\n",
    "\x80\n\x81\n\x88 \x89\n",
]


@pytest.mark.parametrize("script", ADVERSARIAL)
def test_heredoc_writes_script_verbatim(tmp_path: Path, script: str) -> None:
    assert roundtrip(script, tmp_path) == (script if script.endswith("\n") else script + "\n")


def test_script_holding_the_delimiter_line_still_round_trips(tmp_path: Path) -> None:
    first = heredoc_delimiter("x\n")
    # A script that contains every delimiter the naive choice would pick.
    script = f"{heredoc_delimiter('')}\n"
    script = script + heredoc_delimiter(script) + "\n"
    assert heredoc_delimiter(script) not in script.split("\n")
    assert roundtrip(script, tmp_path) == script
    assert "NYMPH_" in first


SHELLS = [sh for sh in ("/bin/sh", "/bin/dash", "/bin/bash", "/bin/busybox") if Path(sh).exists()]


def roundtrip(script: str, tmp_path: Path, shell: str = "/bin/sh") -> str:
    target = tmp_path / "u.py"
    cmd = heredoc_command(script, path=str(target)).replace(f"exec python3 {target}\n", "")
    argv = [shell, "sh", "-c", cmd] if shell.endswith("busybox") else [shell, "-c", cmd]
    subprocess.run(argv, check=True, env={"PATH": os.environ["PATH"]})
    return target.read_bytes().decode("utf-8")


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("script", ADVERSARIAL)
def test_heredoc_is_verbatim_in_every_shell_here(tmp_path: Path, script: str, shell: str) -> None:
    assert roundtrip(script, tmp_path, shell) == (script if script.endswith("\n") else script + "\n")


scripts = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=400
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(script=scripts)
def test_any_script_round_trips_through_the_heredoc(tmp_path: Path, script: str) -> None:
    expected = script if script.endswith("\n") or script == "" else script + "\n"
    if script == "":
        expected = "\n"
    assert roundtrip(script, tmp_path) == expected


def test_rendered_command_runs_the_script_with_python(tmp_path: Path) -> None:
    script = "import sys\nprint('EOF', '$(x)', sys.argv[0].endswith('u.py'))\n"
    target = tmp_path / "u.py"
    cmd = heredoc_command(script, path=str(target)).replace("python3", sys.executable)
    out = subprocess.run(["/bin/sh", "-c", cmd], capture_output=True, text=True, check=True).stdout
    assert out == "EOF $(x) True\n"


@settings(max_examples=60, deadline=None)
@given(script=scripts.filter(lambda s: s.strip() != ""))
def test_script_survives_yaml_and_json_serialisation(script: str) -> None:
    pod = render_pod(spec(script))
    arg = pod["spec"]["containers"][0]["args"][0]
    assert yaml.safe_load(to_yaml(pod))["spec"]["containers"][0]["args"][0] == arg
    assert json.loads(to_json(pod))["spec"]["containers"][0]["args"][0] == arg


def test_pod_carries_the_launch_annotation() -> None:
    from dataclasses import replace

    from nymph.launch.render import ANNOTATION_LAUNCH

    plain = spec()
    derived = render_pod(plain)["metadata"]["annotations"][ANNOTATION_LAUNCH]
    assert (
        derived.startswith("sha256-")
        and derived == render_pod(spec())["metadata"]["annotations"][ANNOTATION_LAUNCH]
    )
    assert render_pod(spec("print(2)\n"))["metadata"]["annotations"][ANNOTATION_LAUNCH] != derived
    uid = replace(plain, launch_uid="0123456789abcdef0123456789abcdef")
    assert render_pod(uid)["metadata"]["annotations"][ANNOTATION_LAUNCH] == uid.launch_uid
    assert LaunchSpec.from_json(uid.to_json()) == uid
    with pytest.raises(ValidationError):
        LaunchSpec.from_json({**uid.to_json(), "launchUid": "a b"})
