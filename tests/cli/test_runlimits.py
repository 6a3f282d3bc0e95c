"""``nymph modes add --field priority=10 --field max_runtime=30m`` and ``nymph launch --priority N
--max-runtime D`` against the real queue (both backends)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.queue_helpers import Served
from tests.support.queue_helpers import run_cli as run


@pytest.mark.usefixtures("cli_isolated")
def test_the_cli_sets_both(env: Served, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert run(capsys, "providers", "add", "kind", "--launcher", "Kube", "--dispatch", "daemon")[0] == 0
    code, _, err = run(
        capsys,
        "modes", "add", "m", "--provider", "kind", "--field", "image=python:3.12-slim",
        "--field", "priority=10", "--field", "max_runtime=30m",
    )  # fmt: skip
    assert code == 0, err
    code, _, err = run(capsys, "modes", "add", "bad", "--provider", "kind", "--field", "priority=high")
    assert code == 2 and "mode.priority" in err
    (tmp_path / "job.py").write_text("print('hi')\n")
    code, _, err = run(capsys, "launch", "kind", "--mode", "m", "--script", "job.py", "--max-runtime", "1d")
    assert code == 0, err
    code, _, err = run(
        capsys,
        "launch",
        "kind",
        "--mode",
        "m",
        "--script",
        "job.py",
        "--priority",
        "20",
        "--max-runtime",
        "2h",
    )
    assert code == 0, err
    code, _, err = run(capsys, "launch", "kind", "--mode", "m", "--script", "job.py", "--max-runtime", "soon")
    assert code == 2 and "launch.fields.max_runtime" in err and "'30m'" in err
    code, _, err = run(capsys, "launch", "kind", "--mode", "m", "--script", "job.py", "--priority", "5000")
    assert code == 2 and "launch.priority" in err

    async def claim() -> list[dict[str, Any]]:
        async with env.client(env.daemon_token) as d:
            tasks = await d.claim(daemon_id="d1", node="n1", capacity=5, wait=0)
        return [dict(t["spec"] or {}) for t in tasks]

    specs = sorted(env.run(claim()), key=lambda s: s["maxRuntime"])
    assert [(s["priority"], s["maxRuntime"]) for s in specs] == [(20, 7200), (10, 86_400)]
