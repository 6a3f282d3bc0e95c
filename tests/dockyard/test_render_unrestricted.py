"""``nymph dockyard render`` on the user's own machine is not held to the queue's Pod policy or
replica cap: what an infra asks for is rendered as written (the queue refuses it later)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from nymph.cli import main

Write = Callable[[str, str], Path]

INFRA = """\
namespace: team-a
image: dockyard/img:1
launch: {mode: rayjob, entrypoint: "python3 -u train.py"}
sandbox: {name: sbx, replicas: 1000}
workspace: {kind: hostPath, hostPath: /data, mountPath: /ws}
kuberay:
  name: grpo
  spec:
    headGroupSpec:
      template:
        spec:
          hostNetwork: true
          containers: [{name: head, securityContext: {privileged: true}}]
    workerGroupSpecs:
      - {groupName: trainer, replicas: 2, template: {spec: {containers: [{name: w}]}}}
      - {groupName: inference, replicas: 1, template: {spec: {containers: [{name: w}]}}}
"""


def test_a_local_render_keeps_what_the_queue_would_refuse(
    write: Write, cli_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe, infra = write("recipe.yaml", "grpo: {max_num_steps: 1}\n"), write("run.infra.yaml", INFRA)
    code = main(["dockyard", "render", str(recipe), "--infra", str(infra)])
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    docs = {d["kind"]: d for d in yaml.safe_load_all(out)}
    assert docs["Deployment"]["spec"]["replicas"] == 1000
    head = docs["RayJob"]["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert head["hostNetwork"] is True
    assert head["containers"][0]["securityContext"]["privileged"] is True
    assert {"path": "/data", "type": "DirectoryOrCreate"} in [
        v.get("hostPath") for v in head.get("volumes", [])
    ]
