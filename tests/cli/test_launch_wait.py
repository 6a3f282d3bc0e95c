"""How ``nymph launch --wait`` ends when the job does not run: 125 with the reason for a launch
stopped because its image could not be pulled; 124 after ``--timeout``, saying the launch goes
on and how to stop it; Ctrl-C (130) saying the same (a queue over real HTTP, a fake daemon)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from nymph.cli import userverbs
from tests.support.queue_helpers import Served
from tests.support.queue_helpers import run_cli as run

pytestmark = pytest.mark.usefixtures("cli_isolated")

WHY = "the image 'localhost:1/nope:latest' could not be pulled for 10s; the launch was stopped"


async def _setup(served: Served) -> None:
    async with served.client(served.user_token) as u:
        await u.create_provider(name="kind", kwargs={"namespace": "jobs"}, dispatch="daemon")
        await u.create_mode(name="small", provider="kind", fields={"image": "localhost:1/nope:latest"})


async def _unpullable(served: Served) -> None:
    async with served.client(served.daemon_token) as d:
        [task] = await d.claim(daemon_id="fd", node="n1", capacity=1, wait=20)
        assert task["spec"]["imagePullTimeout"] == 120  # the queue's default, carried to the daemon
        await d.complete(daemon_id="fd", task_id=task["taskId"], ok=True)
        for seq, (state, message) in enumerate([("starting", "ErrImagePull: dial tcp"), ("stopped", WHY)], 1):
            await asyncio.sleep(0.1)
            report = {
                "seq": seq,
                "instanceId": task["instanceId"],
                "state": state,
                "reason": "ImagePull",
                "message": message,
            }
            await d.report(daemon_id="fd", stream="fd", reports=[report])


def test_an_image_that_cannot_be_pulled_exits_125_with_the_reason(
    env: Served, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """stopped / ImagePull: exit 125 (never ran), the message saying why."""
    env.run(_setup(env))
    daemon = env.spawn(_unpullable(env))
    (tmp_path / "job.py").write_text("print(1)\n")
    code, _, err = run(capsys, "launch", "kind", "--mode", "small", "--script", "job.py", "--wait", "--quiet")
    daemon.result(10)
    assert code == 125, err
    assert f"never ran: ImagePull: {WHY}" in err


def test_wait_timeout_exits_124_and_says_how_to_stop(
    env: Served, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Nobody runs the launch: after --timeout the command exits 124, the launch still queued."""
    env.run(_setup(env))
    (tmp_path / "job.py").write_text("print(1)\n")
    code, out, err = run(
        capsys, "launch", "kind", "--mode", "small", "--script", "job.py", "--wait", "--timeout", "1s"
    )
    iid = out.split()[0]
    assert code == 124, err
    assert "gave up waiting after 1s" in err
    assert f"{iid} is still queued" in err and f"nymph stop kind {iid}" in err


def test_a_bad_timeout_is_a_usage_error(
    env: Served, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """--timeout takes a duration; anything else is refused before launching."""
    (tmp_path / "job.py").write_text("print(1)\n")
    code, out, err = run(
        capsys, "launch", "kind", "--mode", "small", "--script", "job.py", "--wait", "--timeout", "soon"
    )
    assert code == 2 and "--timeout" in err and out == ""


def test_ctrl_c_says_the_launch_goes_on(
    env: Served, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while waiting: exit 130, the launch left as it is and the stop command shown."""
    env.run(_setup(env))

    async def interrupted(*_args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(userverbs, "_wait", interrupted)
    (tmp_path / "job.py").write_text("print(1)\n")
    code, out, err = run(capsys, "launch", "kind", "--mode", "small", "--script", "job.py", "--wait")
    iid = out.split()[0]
    assert code == 130, err
    assert f"{iid} was launched and goes on" in err and f"nymph stop kind {iid}" in err


async def _fail_then_complete(served: Served) -> None:
    """Attempt 1 runs and exits 3; its retry runs and completes."""
    async with served.client(served.daemon_token) as d:
        seq = 0
        for reason, code in (("Error", 3), ("Completed", 0)):
            [task] = await d.claim(daemon_id="fd", node="n1", capacity=1, wait=20)
            await d.complete(daemon_id="fd", task_id=task["taskId"], ok=True)
            for state in ("running", "stopped"):
                seq += 1
                report: dict[str, object] = {"seq": seq, "instanceId": task["instanceId"], "state": state}
                if state == "stopped":
                    report.update(reason=reason, message="", exitCode=code, terminationReason=reason)
                await d.report(daemon_id="fd", stream="fd", reports=[report])


def test_wait_follows_the_retries_and_instances_shows_the_attempt(
    env: Served, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """launch --wait follows the launch to its retry and exits with the last attempt's code;
    nymph instances has an ATTEMPT column once launches carry a retry policy."""
    env.run(_setup(env))
    daemon = env.spawn(_fail_then_complete(env))
    (tmp_path / "job.py").write_text("print(1)\n")
    retry = 'retry={"limit": 1, "on": ["exit:3"], "backoff": "0s"}'
    code, out, err = run(
        capsys,
        "launch",
        "kind",
        "--mode",
        "small",
        "--script",
        "job.py",
        "--field",
        retry,
        "--wait",
        "--quiet",
    )
    daemon.result(10)
    first = out.split()[0]
    assert code == 0, err
    assert f"{first} is retried as" in err
    code, out, _ = run(capsys, "instances", "kind")
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["INSTANCE", "STATE", "ATTEMPT"]
    assert [line.split()[2] for line in lines[1:]] == ["1", "2"]
