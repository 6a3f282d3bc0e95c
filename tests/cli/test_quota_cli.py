"""``nymph quota set|show`` against a real queue (an admin token sets, a user token is told what
token it needs, flags that are not numbers are refused before any call), and ``nymph launch
--wait`` saying why a launch is still queued."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.support.queue_helpers import Served
from tests.support.queue_helpers import run_cli as run

pytestmark = pytest.mark.usefixtures("cli_isolated")


async def _setup(served: Served) -> None:
    async with served.client(served.user_token) as u:
        await u.create_provider(
            name="kind", kwargs={"namespace": "jobs"}, dispatch="daemon", namespace="team-a"
        )
        await u.create_mode(
            name="small", provider="kind", fields={"image": "python:3.12-slim"}, namespace="team-a"
        )


def test_quota_set_and_show(
    env: Served, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run(capsys, "quota", "set", "team-a", "--max-running", "5")
    assert code == 2 and "admin token" in err and "--role admin" in err
    code, _, err = run(capsys, "quota", "set", "team-a")
    assert code == 2 and "nothing to set" in err
    monkeypatch.setenv("NYMPH_TOKEN", env.admin_token)
    code, _, err = run(capsys, "quota", "set", "team-a", "--max-running", "many")
    assert code == 2 and "--max-running 'many' is not a whole number" in err
    code, out, err = run(
        capsys,
        "quota",
        "set",
        "team-a",
        "--weight",
        "2",
        "--max-running",
        "5",
        "--gpu",
        "8",
        "--max-runtime",
        "1d",
    )
    assert code == 0, err
    header, row = out.splitlines()
    assert header.split()[:3] == ["NAMESPACE", "WEIGHT", "RUNNING/MAX"]
    assert row.split()[:4] == ["team-a", "2", "0/5", "nvidia.com/gpu"]
    assert "1d" in row
    code, _, err = run(capsys, "quota", "set", "team-a", "--max-runtime", "2 weeks")
    assert code == 2 and "quota.maxRuntime" in err
    code, out, _ = run(capsys, "quota", "set", "team-a", "--max-running", "none")
    assert code == 0 and out.splitlines()[1].split()[:3] == ["team-a", "2", "0/-"]
    code, out, _ = run(capsys, "quota", "show")
    assert code == 0 and [line.split()[0] for line in out.splitlines()[1:]] == ["team-a"]
    # a user of the namespace may read its own
    monkeypatch.setenv("NYMPH_TOKEN", env.user_token)
    code, out, _ = run(capsys, "quota", "show", "team-a")
    assert code == 0 and out.splitlines()[1].split()[:3] == ["team-a", "2", "0/-"]


def test_launch_wait_says_why_a_launch_is_queued(
    env: Served, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    env.run(_setup(env))

    async def run_it_later() -> None:
        await asyncio.sleep(1.5)
        async with env.client(env.daemon_token) as d:
            [task] = await d.claim(daemon_id="fd", node="n1", capacity=1, wait=20)
            await d.complete(daemon_id="fd", task_id=task["taskId"], ok=True)
            report = {"seq": 1, "instanceId": task["instanceId"], "state": "stopped", "reason": "Completed"}
            await d.report(daemon_id="fd", stream="fd", reports=[report])

    daemon = env.spawn(run_it_later())
    (tmp_path / "job.py").write_text("print(1)\n")
    code, _, err = run(
        capsys, "launch", "kind", "-n", "team-a", "--mode", "small", "--script", "job.py", "--wait"
    )
    daemon.result(20)
    assert code == 0, err
    assert "waiting: 1st of 1 in team-a" in err
    assert err.index("waiting: 1st of 1 in team-a") < err.index("stopped (Completed)")
