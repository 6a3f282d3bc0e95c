"""``nymph launch --wait`` with the job's output and exit code, and ``nymph logs -f``, against a
real server and a fake daemon that ships a log."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from nymph.cli.userview import NEVER_RAN_EXIT
from tests.cli.test_user_verbs import _setup
from tests.support.queue_helpers import Served
from tests.support.queue_helpers import run_cli as run

pytestmark = pytest.mark.usefixtures("cli_isolated")


async def _daemon(served: Served, *, printed: list[bytes], ran: bool, exit_code: int | None) -> str:
    async with served.client(served.daemon_token) as d:
        [task] = await d.claim(daemon_id="fd", node="n1", capacity=1, wait=20)
        iid = task["instanceId"]
        await d.complete(daemon_id="fd", task_id=task["taskId"], ok=True)
        seq = 0

        async def report(state: str, reason: str | None = None, **extra: object) -> None:
            nonlocal seq
            seq += 1
            r = {"seq": seq, "instanceId": iid, "state": state, "reason": reason, **extra}
            await d.report(daemon_id="fd", stream="fd", reports=[r])

        await report("starting")
        if not ran:
            await report("stopped", "ImagePull", message="no such image")
            return iid
        await report("running")
        offset = 0
        for piece in printed:
            await asyncio.sleep(0.2)
            await d.ship_log_chunk(daemon_id="fd", instance_id=iid, offset=offset, data=piece)
            offset += len(piece)
        ended = {"exitCode": exit_code, "terminationReason": "Error"} if exit_code is not None else {}
        await report("stopped", "Error" if exit_code else "Completed", **ended)
        await d.ship_log_chunk(daemon_id="fd", instance_id=iid, offset=offset, data=b"", final=True)
        return iid


@pytest.mark.parametrize("quiet", [False, True])
def test_launch_wait_prints_the_output_and_exits_with_the_jobs_code(
    env: Served,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    quiet: bool,
) -> None:
    env.run(_setup(env))
    printed = [b"step 1\n", b"step 2\n", b"done\n"]
    daemon = env.spawn(_daemon(env, printed=printed, ran=True, exit_code=7))
    (tmp_path / "job.py").write_text("print(1)\n")
    flags = ["--wait", "--quiet"] if quiet else ["--wait"]
    got, out, err = run(
        capsys, "launch", "kind", "--mode", "small", "--script", str(tmp_path / "job.py"), *flags
    )
    iid = daemon.result(10)
    assert got == 7, err
    assert out == f"{iid}\n" + ("" if quiet else "step 1\nstep 2\ndone\n")
    assert "stopped (Error)" in err and "exit code 7" in err
    # the log stays readable, whole or followed
    code, out, _ = run(capsys, "logs", "kind", iid)
    assert code == 0 and out == "step 1\nstep 2\ndone\n"
    code, out, _ = run(capsys, "logs", "kind", iid, "-f")
    assert code == 0 and out == "step 1\nstep 2\ndone\n"


def test_launch_wait_of_a_job_that_never_ran_exits_with_the_reserved_code(
    env: Served,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    env.run(_setup(env))
    daemon = env.spawn(_daemon(env, printed=[], ran=False, exit_code=None))
    (tmp_path / "job.py").write_text("print(1)\n")
    got, out, err = run(
        capsys, "launch", "kind", "--mode", "small", "--script", str(tmp_path / "job.py"), "--wait"
    )
    iid = daemon.result(10)
    assert got == NEVER_RAN_EXIT == 125
    assert out == f"{iid}\n"
    assert f"{iid} never ran: ImagePull: no such image" in err
