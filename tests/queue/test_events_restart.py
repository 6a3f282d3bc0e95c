"""The event stream across a ``kill -9`` of ``nymph queue serve`` (a real process, on SQLite and on
PostgreSQL): a follower that reconnects after the last cursor it received, while 500 launches
are submitted and run to the end by a simulated daemon, receives every change exactly once, in
commit order, and per instance in the order it happened."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from nymph.client import QueueClient, QueueConflict, QueueUnavailable
from nymph.client.events import events_page, follow_events
from nymph.localcluster.procs import free_port
from nymph.protocol import EventJSON
from tests.queue.test_restart import create_token
from tests.support.harness import wait_http
from tests.support.hygiene_plugin import stop_process, track

LAUNCHES = 500
#: What every instance goes through, one event each: queued, applied on n1, running, its exit
#: code, stopped.
LIFE = [["created", "state"], ["node"], ["state"], ["exitCode"], ["state", "reason"]]


def _serve(db: Path | str, port: int, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        proc = track(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "nymph.cli",
                    "queue",
                    "serve",
                    "--db",
                    str(db),
                    "--listen",
                    f"127.0.0.1:{port}",
                    "--sweep-interval",
                    "0.5",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    wait_http(f"http://127.0.0.1:{port}/healthz", timeout=60)
    return proc


async def _again(call: Any) -> Any:
    """``call()`` until the queue answers (it may be down or restarting)."""
    for _ in range(600):
        try:
            return await call()
        except QueueUnavailable:
            await asyncio.sleep(0.1)
    raise AssertionError("the queue did not come back")


async def test_a_follower_sees_every_change_once_across_a_kill_9(
    tmp_path: Path, queue_db: Path | str
) -> None:
    db, log, port = queue_db, tmp_path / "serve.log", free_port()
    user_token, daemon_token = create_token(db, "user"), create_token(db, "daemon")
    url = f"http://127.0.0.1:{port}"
    proc = await asyncio.to_thread(_serve, db, port, log)
    followed: list[EventJSON] = []
    wanted = [LAUNCHES * len(LIFE)]
    caught_up = asyncio.Event()

    def on_event(e: EventJSON) -> None:
        followed.append(e)
        if len(followed) >= wanted[0]:
            caught_up.set()

    accepted: set[str] = set()
    async with (
        QueueClient(base_url=url, token=user_token, timeout=10) as user,
        QueueClient(base_url=url, token=user_token, timeout=10) as watcher,
        QueueClient(base_url=url, token=daemon_token, timeout=10) as daemon,
    ):
        await user.create_provider(name="kind", kwargs={"namespace": "jobs"}, dispatch="daemon")
        await user.create_mode(name="small", provider="kind", fields={"image": "python:3.12-slim"})
        follower = asyncio.create_task(
            follow_events(
                watcher, on_event=on_event, filters={"provider": "kind"}, retries=1000, backoff=0.05
            )
        )
        halfway = asyncio.Event()
        todo = list(range(LAUNCHES))

        async def launcher() -> None:
            while todo:
                i = todo.pop()
                key = f"launch-{i}-{uuid.uuid4().hex}"
                a = await _again(
                    lambda key=key, i=i: user.launch(
                        provider="kind", mode="small", script=f"print({i})", idempotency_key=key
                    )
                )
                accepted.add(a["instanceId"])
                if len(accepted) >= LAUNCHES // 2:
                    halfway.set()

        finished: set[str] = set()

        async def run_batch(n: int, tasks: list[dict[str, Any]]) -> None:
            """Apply, run and end claimed launches (completions and reports sent together, as
            the daemon sends them); a launch whose lease lapsed while the queue was down was
            handed back, and a later claim gets it again."""
            completions = [{"task_id": t["taskId"], "ok": True} for t in tasks]
            answers = await _again(lambda: daemon.complete_many(daemon_id="d1", completions=completions))
            applied = [t["instanceId"] for t, a in zip(tasks, answers, strict=True) if isinstance(a, dict)]
            assert all(isinstance(a, dict | QueueConflict) for a in answers), answers
            reports: list[dict[str, Any]] = []
            for iid in applied:
                reports.append({"instanceId": iid, "state": "running", "node": "n1"})
                reports.append(
                    {"instanceId": iid, "state": "stopped", "reason": "Completed", "node": "n1"}
                    | {"exitCode": 0, "terminationReason": "Completed"}
                )
            numbered = [{"seq": k + 1, **r} for k, r in enumerate(reports)]
            if numbered:
                await _again(lambda: daemon.report(daemon_id="d1", stream=f"batch-{n}", reports=numbered))
            finished.update(applied)

        async def simulated_daemon() -> None:
            n = 0
            while len(finished) < LAUNCHES:
                tasks = await _again(
                    lambda: daemon.claim(daemon_id="d1", node="n1", capacity=50, wait=1, lease_seconds=5)
                )
                n += 1
                await run_batch(n, tasks)

        # The daemon is seen before the first launch: no launch ever waits for want of one.
        assert await daemon.claim(daemon_id="d1", node="n1", capacity=1, wait=0) == []
        workers = [asyncio.create_task(launcher()) for _ in range(8)]
        runner = asyncio.create_task(simulated_daemon())
        await asyncio.wait_for(halfway.wait(), 120)
        os.kill(proc.pid, signal.SIGKILL)  # launches, completions, reports and the stream in flight
        await asyncio.to_thread(proc.wait, 30)
        assert proc.returncode == -signal.SIGKILL
        proc = await asyncio.to_thread(_serve, db, port, log)
        try:
            await asyncio.wait_for(asyncio.gather(*workers), 240)
            await asyncio.wait_for(runner, 240)
            assert len(accepted) == LAUNCHES
            # Every event the queue holds, read page by page; the follower catches up with it.
            everything: list[EventJSON] = []
            cursor: str | None = None
            while True:
                items, cursor = await events_page(user, after=cursor, limit=400, filters={"provider": "kind"})
                everything += items
                if not items:
                    break
            wanted[0] = len(everything)
            if len(followed) >= wanted[0]:
                caught_up.set()
            await asyncio.wait_for(caught_up.wait(), 60)
        finally:
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)
            await asyncio.to_thread(stop_process, proc, sig=signal.SIGTERM)
    cursors = [e["cursor"] for e in followed]
    assert len(set(cursors)) == len(cursors), "an event was delivered twice"
    assert cursors == [e["cursor"] for e in everything], "the followed stream differs from the stored one"
    assert [int(c) for c in cursors] == sorted(int(c) for c in cursors)
    by_instance: dict[str, list[list[str]]] = {}
    for e in followed:
        by_instance.setdefault(e["instanceId"], []).append(e["changes"])
    assert set(by_instance) == accepted
    lives = Counter(str(life) for life in by_instance.values())
    assert lives == Counter({str(LIFE): LAUNCHES}), lives.most_common(3)
    assert all(e["state"] == "stopped" for e in followed if e["changes"] == LIFE[-1])
