"""A stopping queue exits within its grace period whatever its worker threads are doing: the
executor behind ``asyncio.to_thread`` never holds the process up, proven on the executor itself
and on a real ``nymph queue serve`` process sent SIGTERM while it is busy rendering."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from concurrent.futures import CancelledError
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from nymph import eventloop
from nymph.queue.threads import CPU_WORKERS, BoundedExecutor, Stopping, run_cpu, start_cpu, stop_cpu
from tests.support.harness import QueueProc

EXAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "examples"
#: serve()'s default grace period for in-flight requests
GRACE = 10.0


def test_jobs_run_at_most_n_at_a_time_on_daemon_threads() -> None:
    ex = BoundedExecutor(workers=2, name="t-worker")
    release = threading.Event()
    running: list[int] = []
    peak: list[int] = []
    lock = threading.Lock()

    def job(i: int) -> int:
        with lock:
            running.append(i)
            peak.append(len(running))
        release.wait(10)
        with lock:
            running.remove(i)
        return i * 2

    futures = [ex.submit(job, i) for i in range(5)]
    time.sleep(0.2)
    assert max(peak) == 2
    release.set()
    assert [f.result(timeout=10) for f in futures] == [0, 2, 4, 6, 8]
    assert all(t.daemon and t.name.startswith("t-worker-") for t in ex.threads)
    ex.shutdown()


def test_shutdown_cancels_what_has_not_started_and_does_not_wait_for_what_has() -> None:
    ex = BoundedExecutor(workers=1)
    started = threading.Event()
    release = threading.Event()

    def block() -> str:
        started.set()
        release.wait(30)
        return "done"

    first = ex.submit(block)
    queued = ex.submit(lambda: "never")
    assert started.wait(5)
    t0 = time.monotonic()
    ex.shutdown(wait=True)
    assert time.monotonic() - t0 < 1.0  # did not wait for the running job
    assert queued.cancelled()
    with pytest.raises(CancelledError):
        queued.result(timeout=1)
    with pytest.raises(RuntimeError):
        ex.submit(lambda: 1)
    release.set()
    assert first.result(timeout=5) == "done"


@pytest.mark.usefixtures("gc_restored")
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
async def test_the_loop_returns_without_waiting_for_a_running_thread(loop: str) -> None:
    """As the default executor of a loop (asyncio's own and uvloop, which the queue runs on), a
    stuck thread does not hold up the loop's shutdown."""
    release = threading.Event()

    async def main() -> None:
        assert eventloop.running_loop_name() == loop
        asyncio.get_running_loop().set_default_executor(BoundedExecutor(workers=1))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.to_thread(release.wait, 60), 0.1)

    t0 = time.monotonic()
    await asyncio.to_thread(eventloop.run, main(), choice=loop)
    assert time.monotonic() - t0 < 5
    release.set()


def _bomb(levels: int = 40) -> dict[str, Any]:
    recipe: dict[str, Any] = yaml.safe_load((EXAMPLES / "dockyard-grpo-vllm.yaml").read_text())
    recipe["b0"] = "x"
    for n in range(1, levels):
        recipe[f"b{n}"] = f"${{b{n - 1}}}${{b{n - 1}}}"
    return recipe


@pytest.mark.slow
async def test_sigterm_stops_a_busy_queue_within_its_grace_period(tmp_path: Path) -> None:
    """Many renders in flight (far more work than the grace period, run one after another):
    SIGTERM still ends the process within the grace period, exit code 0, "stopped" said; the
    renders not started are answered 503 at once instead of holding up the shutdown."""
    q = QueueProc(tmp_path / "queue.db")
    q.tokens()
    q.start()
    assert q.proc is not None
    infra: dict[str, Any] = yaml.safe_load((EXAMPLES / "dockyard-grpo-vllm.infra.yaml").read_text())
    infra.pop("namespace", None)
    headers = {"Authorization": f"Bearer {q.user_token}"}
    async with aiohttp.ClientSession(headers=headers) as http:
        r = await http.post(
            f"{q.url}/v1/namespaces/default/providers",
            json={"name": "kind", "launcher": "Kube", "dispatch": "daemon", "kwargs": {"namespace": "jobs"}},
        )
        assert r.status == 201, await r.text()
        body = {"recipe": _bomb(), "infra": infra}
        url = f"{q.url}/v1/namespaces/default/providers/kind/dockyard"
        # one answer first: a bomb is a 400 and says why
        r = await http.post(url, json=body)
        assert r.status == 400 and "interpolation steps" in (await r.json())["detail"]

        async def post() -> int | str:
            try:
                async with http.post(url, json=body, timeout=aiohttp.ClientTimeout(total=120)) as resp:
                    return resp.status
            except (aiohttp.ClientError, TimeoutError) as exc:
                return type(exc).__name__

        t_one = time.monotonic()
        await post()
        one = time.monotonic() - t_one
        # enough renders to keep the worker threads busy for twice the grace period
        count = max(16, int(2 * GRACE / max(one, 0.05)) + 1)
        flight = [asyncio.create_task(post()) for _ in range(count)]
        await asyncio.sleep(0.5)
        t0 = time.monotonic()
        q.proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(q.proc.wait, GRACE + 20)
        took = time.monotonic() - t0
        answers = await asyncio.gather(*flight)
    log = (tmp_path / "queue.log").read_text()
    assert code == 0, log[-2000:]
    assert took < GRACE + 3, (took, count, one)
    assert "nymph queue: stopped" in log
    assert '"event_loop":"uvloop"' in log  # what the deployed queue runs on
    # answered: refused by the budget (400) or, not started yet, "the queue is stopping" (503)
    assert set(answers) <= {400, 503, "ServerDisconnectedError"}, answers
    assert 503 in answers


async def test_renders_not_started_when_the_queue_stops_are_refused_at_once() -> None:
    release = threading.Event()
    busy = [asyncio.create_task(run_cpu(release.wait, 30)) for _ in range(CPU_WORKERS)]
    waiting = asyncio.create_task(run_cpu(lambda: "never"))
    await asyncio.sleep(0.2)
    stop_cpu()
    try:
        with pytest.raises(Stopping):
            await waiting
        with pytest.raises(Stopping):  # nor is anything that comes later
            await run_cpu(lambda: "later")
        release.set()
        assert await asyncio.gather(*busy) == [True] * CPU_WORKERS  # the running ones finished
    finally:
        release.set()
        start_cpu()  # what the next queue of this process does
    assert await run_cpu(lambda: 42) == 42  # a new executor serves the next queue
