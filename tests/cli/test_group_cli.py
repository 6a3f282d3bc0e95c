"""``nymph launch --count/--items`` and ``nymph group show|wait|stop`` against a real queue (a
fake daemon finishes the launches): wait exits 0 when every member completed, 1 with the counts
when any did not, 2 for a group that does not exist."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.queue_helpers import Served
from tests.support.queue_helpers import run_cli as run

pytestmark = pytest.mark.usefixtures("cli_isolated")


async def _setup(served: Served) -> None:
    async with served.client(served.user_token) as u:
        await u.create_provider(name="kind", kwargs={"namespace": "jobs"}, dispatch="daemon")
        await u.create_mode(name="small", provider="kind", fields={"image": "python:3.12-slim"})


async def _finish(served: Served, *, count: int, fail_index: int | None = None) -> list[dict[str, object]]:
    """Claim ``count`` launches and end each Completed (the one at ``fail_index``: Error)."""
    async with served.client(served.daemon_token) as d:
        tasks = await d.claim(daemon_id="fd", node="n1", capacity=count, wait=5)
        assert len(tasks) == count
        reports = []
        for seq, task in enumerate(tasks, 1):
            await d.complete(daemon_id="fd", task_id=task["taskId"], ok=True)
            failed = task["spec"]["groupIndex"] == fail_index
            reports.append(
                {
                    "seq": seq,
                    "instanceId": task["instanceId"],
                    "state": "stopped",
                    "reason": "Error" if failed else "Completed",
                    "message": "",
                }
            )
        await d.report(daemon_id="fd", stream="fd", reports=reports)
        return [t["spec"] for t in tasks]


def test_a_counted_group_is_launched_shown_and_waited_for(
    env: Served, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    env.run(_setup(env))
    (tmp_path / "job.py").write_text("print(1)\n")
    code, out, err = run(capsys, "launch", "kind", "--mode", "small", "--script", "job.py", "--count", "3")
    assert code == 0, err
    gid = out.split()[0]
    assert gid.startswith("group-") and "3 launches queued" in err
    code, out, _ = run(capsys, "group", "show", gid)
    assert code == 0 and "3 launches: queued 3" in out
    env.run(_finish(env, count=3))
    code, out, err = run(capsys, "group", "wait", gid)
    assert code == 0 and "all 3 completed" in out, (out, err)
    code, out, _ = run(capsys, "group", "show", gid, "-o", "json")
    assert json.loads(out)["reasons"] == {"Completed": 3}


def test_items_lines_become_members_and_a_failed_member_makes_wait_exit_1(
    env: Served, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    env.run(_setup(env))
    (tmp_path / "job.py").write_text("print(1)\n")
    lines = [{"env": {"LR": "0.1"}}, {"env": {"LR": "0.2"}, "tags": {"arm": "b"}}]
    (tmp_path / "items.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    code, out, err = run(
        capsys,
        "launch",
        "kind",
        "--mode",
        "small",
        "--script",
        "job.py",
        "--items",
        "items.jsonl",
        "--env",
        "E=1",
    )
    assert code == 0, err
    gid = out.split()[0]
    specs = env.run(_finish(env, count=2, fail_index=1))
    by_index = {s["groupIndex"]: dict(s["env"]) for s in specs}
    assert by_index == {0: {"E": "1", "LR": "0.1"}, 1: {"E": "1", "LR": "0.2"}}
    code, out, _ = run(capsys, "group", "wait", gid)
    assert code == 1 and "not all completed" in out and "Error 1" in out and "Completed 1" in out


def test_stop_ends_a_queued_group_and_wait_then_exits_1(
    env: Served, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    env.run(_setup(env))
    (tmp_path / "job.py").write_text("print(1)\n")
    (tmp_path / "bad.jsonl").write_text('{"colour": 1}\n')
    code, _, err = run(
        capsys, "launch", "kind", "--mode", "small", "--script", "job.py", "--items", "bad.jsonl"
    )
    assert code == 2 and "line 1" in err and "colour" in err
    code, out, _ = run(capsys, "launch", "kind", "--mode", "small", "--script", "job.py", "--count", "2")
    gid = out.split()[0]
    code, out, _ = run(capsys, "group", "stop", gid)
    assert code == 0 and "stopped 2" in out
    code, out, _ = run(capsys, "group", "stop", gid)
    assert code == 0
    code, out, _ = run(capsys, "group", "wait", gid)
    assert code == 1 and "Stopped 2" in out
    code, _, err = run(capsys, "group", "wait", "group-000000000000")
    assert code == 2 and "group-000000000000" in err
