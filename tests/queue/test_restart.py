"""``nymph queue serve`` as a real process (on SQLite and on PostgreSQL): kill -9 loses nothing
accepted; SIGTERM is graceful."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from nymph.client import QueueClient, QueueError


def nymph(*args: str) -> list[str]:
    return [sys.executable, "-m", "nymph.cli", *args]


def create_token(db: Path | str, role: str) -> str:
    out = subprocess.run(
        nymph("queue", "token", "create", "--db", str(db), "--role", role, "--name", f"ci-{role}"),
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return out.stdout.split()[-1]


def start_server(db: Path | str, log: Path) -> subprocess.Popen[str]:
    with log.open("a") as err:
        return subprocess.Popen(
            nymph("queue", "serve", "--db", str(db), "--listen", "127.0.0.1:0"),
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )


@asynccontextmanager
async def serving(db: Path | str, log: Path) -> AsyncIterator[tuple[subprocess.Popen[str], str]]:
    proc = await asyncio.to_thread(start_server, db, log)
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
        assert "serving on http://" in line, line
        url = line.split("serving on ", 1)[1].split()[0]
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)


async def test_kill_9_loses_no_accepted_launch_or_report(tmp_path: Path, queue_db: Path | str) -> None:
    db, log = queue_db, tmp_path / "serve.log"
    user_token, daemon_token = create_token(db, "user"), create_token(db, "daemon")
    accepted: list[str] = []
    reported: list[str] = []
    async with (
        serving(db, log) as (proc, url),
        QueueClient(base_url=url, token=user_token, timeout=10) as user,
        QueueClient(base_url=url, token=daemon_token, timeout=10) as daemon,
    ):
        await user.create_provider(name="kind", kwargs={"namespace": "jobs"}, dispatch="daemon")
        await user.create_mode(name="small", provider="kind", fields={"image": "python:3.12-slim"})
        enough, some = asyncio.Event(), asyncio.Event()

        async def launcher(k: int) -> None:
            for i in range(40):
                try:
                    a = await user.launch(provider="kind", mode="small", script=f"print({k}, {i})")
                except QueueError:
                    return  # the server is gone
                accepted.append(a["instanceId"])
                if len(accepted) >= 20:
                    some.set()
                if len(accepted) >= 120:
                    enough.set()

        async def reporter() -> None:
            await some.wait()
            # Reports come from the daemon that claimed the launches; it hands the leases back
            # (a daemon shutting down), and stays their last holder until another claims them.
            tasks = await daemon.claim(daemon_id="d1", node="n1", capacity=10, wait=0)
            batch = [t["instanceId"] for t in tasks]
            assert len(batch) == 10
            await daemon.release(daemon_id="d1", task_ids=[t["taskId"] for t in tasks])
            answer = await daemon.report(
                daemon_id="d1",
                stream="d1",
                reports=[
                    {"seq": n + 1, "instanceId": iid, "state": "running", "node": "n1"}
                    for n, iid in enumerate(batch)
                ],
            )
            assert answer["accepted"] == 10
            reported.extend(batch)

        launchers = [asyncio.create_task(launcher(k)) for k in range(8)]
        await reporter()
        await asyncio.wait_for(enough.wait(), 60)
        os.kill(proc.pid, signal.SIGKILL)  # while launches are still in flight
        await asyncio.gather(*launchers)
    assert proc.returncode == -signal.SIGKILL
    assert len(accepted) >= 120 and len(reported) == 10

    async with (
        serving(db, log) as (proc, url),
        QueueClient(base_url=url, token=user_token) as user,
        QueueClient(base_url=url, token=daemon_token) as daemon,
    ):
        items = await user.list_instances(provider="kind")
        by_id = {i["instanceId"]: i for i in items}
        assert set(accepted) <= set(by_id)
        for iid in reported:
            assert by_id[iid]["state"] == "running" and by_id[iid]["node"] == "n1"
        # Every accepted launch still has its task for a daemon.
        tasks = await daemon.claim(daemon_id="d2", node="n1", capacity=1000, wait=0)
        assert set(accepted) <= {t["instanceId"] for t in tasks}
        # The report stream's mark survived too: a resend is ignored.
        resend = [{"seq": 1, "instanceId": reported[0], "state": "starting"}]
        assert (await daemon.report(daemon_id="d1", stream="d1", reports=resend))["accepted"] == 0


async def test_sigterm_releases_long_polls_and_exits_cleanly(tmp_path: Path, queue_db: Path | str) -> None:
    db, log = queue_db, tmp_path / "serve.log"
    daemon_token = create_token(db, "daemon")
    async with serving(db, log) as (proc, url), QueueClient(base_url=url, token=daemon_token) as daemon:
        held = asyncio.create_task(daemon.claim(daemon_id="d1", node="n1", capacity=1, wait=60))
        await asyncio.sleep(0.5)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(held, 10) == []
        assert await asyncio.to_thread(proc.wait, 15) == 0
        assert time.monotonic() - t0 < 10
    assert "stopped" in await asyncio.to_thread(log.read_text)


def test_serve_refuses_a_bad_listen_address(tmp_path: Path) -> None:
    out = subprocess.run(
        nymph("queue", "serve", "--db", str(tmp_path / "q.db"), "--listen", "localhost"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "--listen 'localhost': expected HOST:PORT" in out.stderr


@pytest.mark.parametrize("role", ["user", "daemon"])
def test_token_create_prints_the_token_last_and_stores_a_hash(tmp_path: Path, role: str) -> None:
    db = tmp_path / "q.db"
    token = create_token(db, role)
    assert token.startswith("nyq_") and len(token) > 40
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("q.db*"))
    assert token.encode() not in raw
    out = subprocess.run(
        nymph("queue", "token", "create", "--db", str(db), "--role", "root"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "invalid choice" in out.stderr
