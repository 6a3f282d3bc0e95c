from __future__ import annotations

import hashlib
import json
import os
import re
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
from nymph.launch.names import node_label, node_selector
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


def test_a_pod_rendered_for_a_node_carries_its_node_label_and_no_tag_can_forge_it() -> None:
    """A daemon watches its own node's Pods by the node label: the Pod rendered for a node
    carries it (the queue's render, for no node, does not), and a launch's tag of that key is
    dropped, as tags on nymph's other keys are."""
    forged = build_launch_spec(
        provider=Provider(name="p", kwargs={"namespace": "jobs"}),
        mode=Mode(name="m", fields={"image": "busybox"}),
        body={"script": "true", "tags": {"nymph.io/node": "node-b"}},
        instance_id=IID,
        owner_namespace="team-a",
    )
    assert render_pod(forged, node="node-a")["metadata"]["labels"]["nymph.io/node"] == "node-a"
    assert "nymph.io/node" not in render_pod(forged)["metadata"]["labels"]
    assert node_selector("node-a") == "lakeshore=true,nymph.io/node=node-a"
    assert node_selector(None) == "lakeshore=true"


@given(
    st.from_regex(
        r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?){0,12}", fullmatch=True
    )
)
def test_every_node_name_has_a_label_value_of_its_own(node: str) -> None:
    """A node name (a DNS subdomain, up to 253 characters) that is a label value is its own
    label; a longer one gets a digest, which is still a valid label value, so every node's
    Pods can be selected."""
    value = node_label(node)
    assert len(value) <= 63 and re.fullmatch(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?", value)
    assert (value == node) == (len(node) <= 63)
    assert node_label(node + "x") != value


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


def exhausting_script() -> str:
    """A script in which every byte the delimiter rule could lead with starts some line."""
    from nymph.launch.render import _LEADS

    lines = ['s = """'] + [f"{lead}x = 1" for lead in _LEADS]
    lines += ["N\u00e9 = 1", "_NYMPH_B64", "\u00e9\u00e8", '"""', "print('ok')"]
    return "\n".join(lines) + "\n"


def test_a_script_with_no_free_lead_byte_is_embedded_encoded() -> None:
    script = exhausting_script()
    assert heredoc_delimiter(script) is None
    cmd = heredoc_command(script)
    assert cmd.endswith("exec python3 /tmp/u.py\n") and "python3 -c 'import base64" in cmd
    body = cmd.split("\n")[1:-3]
    assert body and all(line and line[0] != "_" and line.isascii() for line in body)
    # scripts with a free lead byte keep the plain heredoc, byte for byte
    digest = hashlib.sha256(b"print(1)\n").hexdigest()[:16].upper()
    assert heredoc_command("print(1)\n") == (
        f"cat > /tmp/u.py <<'ANYMPH_{digest}'\nprint(1)\nANYMPH_{digest}\nexec python3 /tmp/u.py\n"
    )


@pytest.mark.parametrize("shell", SHELLS)
def test_encoded_script_round_trips_in_every_shell_here(tmp_path: Path, shell: str) -> None:
    script = exhausting_script()
    target = tmp_path / "u.py"
    cmd = heredoc_command(script, path=str(target)).replace("python3 -c", f"{sys.executable} -c")
    cmd = cmd.replace(f"exec python3 {target}\n", "")
    argv = [shell, "sh", "-c", cmd] if shell.endswith("busybox") else [shell, "-c", cmd]
    subprocess.run(argv, check=True, env={"PATH": os.environ["PATH"]})
    assert target.read_bytes() == script.encode("utf-8")


def test_rendered_pod_of_an_exhausting_script_runs_under_sh(tmp_path: Path) -> None:
    script = exhausting_script()
    pod = render_pod(spec(script))
    arg = yaml.safe_load(to_yaml(pod))["spec"]["containers"][0]["args"][0]
    target = tmp_path / "u.py"
    cmd = arg.replace("/tmp/u.py", str(target)).replace("python3", sys.executable)
    shell = "/bin/dash" if Path("/bin/dash").exists() else "/bin/sh"
    out = subprocess.run([shell, "-c", cmd], capture_output=True, text=True, check=True).stdout
    assert out == "ok\n"
    assert target.read_bytes() == script.encode("utf-8")


def test_command_over_one_argument_is_refused_naming_the_script() -> None:
    import random

    rng = random.Random(7)
    # incompressible and no free lead byte: the encoded form outgrows one argv string
    from nymph.launch.spec import MAX_SCRIPT_BYTES

    noise = "".join(chr(rng.randrange(33, 127)) for _ in range(118_000))
    script = exhausting_script() + noise + "\n"
    assert len(script.encode()) <= MAX_SCRIPT_BYTES
    with pytest.raises(ValidationError) as err:
        heredoc_command(script)
    assert err.value.field == "script"


@pytest.mark.parametrize("field", ["tolerations", "resources", "node_selector", "env"])
def test_nesting_beyond_the_limit_is_refused_naming_the_field(field: str) -> None:
    from nymph.launch.specids import MAX_DEPTH

    deep: Any = "x"
    for _ in range(900):
        deep = [deep]
    value = {"tolerations": [{"key": deep}], "resources": {"claims": deep}}.get(field, {"A": deep})
    with pytest.raises(ValidationError) as err:
        spec(**{field: value})
    assert err.value.field == f"mode.{field}"
    shallow: Any = "x"
    for _ in range(MAX_DEPTH - 2):
        shallow = [shallow]
    if field == "tolerations":
        render_pod(spec(tolerations=[{"key": shallow}]))
    good = spec()
    with pytest.raises(ValidationError) as err:
        LaunchSpec.from_json({**good.to_json(), "tolerations": [{"key": deep}]})
    assert err.value.field == "spec.tolerations"
