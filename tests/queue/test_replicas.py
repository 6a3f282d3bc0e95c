"""Several ``nymph queue serve`` processes on one PostgreSQL database (the real server of
:mod:`tests.support.pg_server`): any replica takes any request, losing one loses nothing, a long-poll on
one wakes for work posted to another, and a database restart answers 503 while it lasts and
loses nothing accepted."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import os
import secrets
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from nymph.client import DaemonIdentity, QueueClient
from nymph.client.errors import QueueConflict, QueueError, QueueNotInstanceDaemon
from tests.support.hygiene_plugin import stop_process, track
from tests.support.latency_proxy import pg_url_through, running_proxy
from tests.support.pg_server import PgServer
from tests.support.tally import TALLY

pytestmark = pytest.mark.slow
#: 200 in the suite; `make bench` and `make faults` run the kill test with 1,000 (NYMPH_REPLICA_LAUNCHES).
LAUNCHES = int(os.environ.get("NYMPH_REPLICA_LAUNCHES", "200"))
#: The delay each way between the replicas and the database (ms; 0: none, the suite's default).
DELAY_MS = float(os.environ.get("NYMPH_PG_DELAY_MS", "0"))
DAEMONS = 6
#: Long enough that no lease runs out while a daemon works on a loaded machine; a claim whose
#: answer was lost with its replica is handed out again after it.
LEASE = 60
FAILURES = (QueueError, aiohttp.ClientError, OSError, TimeoutError)


@dataclass
class Cluster:
    """Queue replicas on one database, started and killed by the test."""

    db: str
    tmp: Path
    user_token: str
    daemon_token: str
    replicas: dict[int, tuple[subprocess.Popen[str], str]] = field(default_factory=dict)
    _ids: Iterator[int] = field(default_factory=itertools.count)

    def _files(self) -> list[str]:
        key, user, daemon = self.tmp / "key", self.tmp / "user", self.tmp / "daemon"
        if not key.exists():
            key.write_text(base64.urlsafe_b64encode(secrets.token_bytes(32)).decode() + "\n")
            user.write_text(self.user_token + "\n")
            daemon.write_text(self.daemon_token + "\n")
        return [
            "--secret-key-file",
            str(key),
            "--import-token",
            f"user:{user}",
            "--import-token",
            f"daemon:{daemon}",
        ]

    def start(self) -> int:
        n = next(self._ids)
        args = ["queue", "serve", "--db", self.db, "--listen", "127.0.0.1:0", "--sweep-interval", "0.3"]
        with (self.tmp / f"replica-{n}.log").open("a") as err:
            proc = track(
                subprocess.Popen(
                    [sys.executable, "-m", "nymph.cli", *args, *self._files()],
                    stdout=subprocess.PIPE,
                    stderr=err,
                    text=True,
                    start_new_session=True,
                )
            )
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "serving on http://" in line, (self.tmp / f"replica-{n}.log").read_text()[-2000:]
        self.replicas[n] = (proc, line.split("serving on ", 1)[1].split()[0])
        return n

    def kill(self, n: int) -> None:
        proc, _ = self.replicas.pop(n)
        stop_process(proc)  # SIGKILL, as a lost node would

    def urls(self) -> list[str]:
        return [url for _, url in self.replicas.values()]

    def stop_all(self) -> None:
        for n in list(self.replicas):
            self.kill(n)


@pytest.fixture
def cluster(pg_server: PgServer, tmp_path: Path) -> Iterator[Cluster]:
    """Replicas on a fresh database; with ``NYMPH_PG_DELAY_MS`` (``make bench`` sets 1) they reach
    it through the latency proxy, a database one round trip away."""
    db = pg_server.fresh_database()
    with contextlib.ExitStack() as stack:
        url = db
        if DELAY_MS > 0:
            socket = str(pg_server.socket_dir / f".s.PGSQL.{pg_server.port}")
            proxy = stack.enter_context(running_proxy(target_unix=socket, delay=DELAY_MS / 1000))
            url = pg_url_through(db, proxy.port)
        c = Cluster(
            db=url,
            tmp=tmp_path,
            user_token="nyq_" + secrets.token_urlsafe(24),
            daemon_token="nyq_" + secrets.token_urlsafe(24),
        )
        try:
            yield c
        finally:
            c.stop_all()
            pg_server.drop_database(db)


@asynccontextmanager
async def client(url: str, token: str) -> AsyncIterator[QueueClient]:
    async with QueueClient(base_url=url, token=token, timeout=30) as c:
        yield c


async def _setup(c: Cluster) -> None:
    async with client(c.urls()[0], c.user_token) as user:
        await user.create_provider(name="kind", kwargs={"namespace": "jobs"}, dispatch="daemon")
        await user.create_mode(name="small", provider="kind", fields={"image": "python:3.12-slim"})


async def _history(c: Cluster) -> list[dict[str, Any]]:
    for url in itertools.cycle(c.urls()):
        try:
            async with client(url, c.user_token) as user:
                return await user.list_instances(provider="kind")
        except FAILURES:
            await asyncio.sleep(0.2)
    raise AssertionError("unreachable")


@pytest.mark.faults
async def test_three_replicas_lose_and_duplicate_nothing_when_one_is_killed(cluster: Cluster) -> None:
    """Three replicas, six daemons, one replica killed with SIGKILL a third of the way through:
    every launch accepted once and run once (part of the fault suite: its line in
    fault-summary.txt)."""
    started = time.monotonic()
    for _ in range(3):
        await asyncio.to_thread(cluster.start)
    await _setup(cluster)
    delivered: Counter[str] = Counter()
    refused: list[str] = []
    errors: list[str] = []
    deliveries: dict[str, list[tuple[int, int, str]]] = {}
    accepted: list[str] = []
    done, third = asyncio.Event(), asyncio.Event()

    async def launcher() -> None:
        for i in range(LAUNCHES):
            key = f"launch-{i}"
            while True:
                url = cluster.urls()[i % len(cluster.urls())]
                try:
                    async with client(url, cluster.user_token) as user:
                        got = await user.launch(
                            provider="kind", mode="small", script=f"print({i})", idempotency_key=key
                        )
                    accepted.append(got["instanceId"])
                    if len(accepted) == LAUNCHES // 3:
                        third.set()
                    break
                except FAILURES:
                    await asyncio.sleep(0.1)  # that replica is gone: another takes it

    async def daemon(k: int) -> None:
        """A fake daemon: claims, reports and completes; when its replica dies it goes on with
        another and finishes the tasks it holds there (as a real daemon's outbox does)."""
        seq = itertools.count(1)
        held: list[dict[str, Any]] = []
        marks: dict[str, tuple[int, int]] = {}
        while not done.is_set():
            urls = cluster.urls()
            url = urls[k % len(urls)]
            try:
                async with client(url, cluster.daemon_token) as d:
                    # Every call registers as the daemon's whole identity, as the real daemon does.
                    d.daemon = DaemonIdentity(daemon_id=f"d{k}", node=f"n{k}", namespaces=("jobs",))
                    while not done.is_set():
                        if not held:
                            held = await d.claim(
                                daemon_id=f"d{k}",
                                node=f"n{k}",
                                namespaces=["jobs"],
                                capacity=5,
                                wait=1,
                                lease_seconds=LEASE,
                            )
                            for t in held:
                                delivered[t["taskId"]] += 1
                                deliveries.setdefault(t["taskId"], []).append((k, t["attempt"], url))
                                marks[t["taskId"]] = (next(seq), next(seq))
                        while held:
                            t = held[0]
                            running, stopped = marks[t["taskId"]]
                            reports = [
                                {
                                    "seq": running,
                                    "instanceId": t["instanceId"],
                                    "state": "running",
                                    "node": f"n{k}",
                                },
                                {
                                    "seq": stopped,
                                    "instanceId": t["instanceId"],
                                    "state": "stopped",
                                    "node": f"n{k}",
                                },
                            ]
                            # Refused when another daemon holds it now (this lease was lost):
                            # dropped, as the daemon's sender drops it.
                            with contextlib.suppress(QueueNotInstanceDaemon):
                                await d.report(daemon_id=f"d{k}", stream=f"s{k}", reports=reports)
                            try:
                                await d.complete(daemon_id=f"d{k}", task_id=t["taskId"], ok=True)
                            except QueueConflict:  # lease lost (expired under load): drop it
                                refused.append(t["taskId"])
                            held.pop(0)
            except FAILURES as exc:
                errors.append(f"d{k} {url}: {exc!r}"[:300])
                await asyncio.sleep(0.2)  # its replica died: go on with another

    async def chaos() -> None:
        await third.wait()
        cluster.kill(0)  # kill -9, mid-run
        TALLY.kills += 1
        await asyncio.to_thread(cluster.start)

    workers = [asyncio.create_task(daemon(k)) for k in range(DAEMONS)]
    try:
        await asyncio.wait_for(asyncio.gather(launcher(), chaos()), 120)
        deadline = time.monotonic() + LEASE + 90
        while True:
            instances = await _history(cluster)
            if sum(i["state"] == "stopped" for i in instances) == LAUNCHES or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
    finally:
        done.set()
        outcomes = await asyncio.gather(*workers, return_exceptions=True)
    crashed = [repr(o) for o in outcomes if isinstance(o, BaseException)]
    # Once each; a task is handed out again only after its holder lost the lease (its completion
    # was refused: the lease fence), and then once more per refusal.
    again = Counter(refused)
    twice = sorted(t for t, n in delivered.items() if n > 1 + again[t])
    ended = {i["instanceId"] for i in instances if i["state"] == "stopped"}
    lost = len(set(accepted) - ended)
    duplicated = (
        len(accepted) - len(set(accepted)) + len({i["instanceId"] for i in instances} - set(accepted))
    )
    TALLY.launches += len(accepted)
    TALLY.lost += lost
    TALLY.duplicated += duplicated + len(twice)
    delay = f" ({DELAY_MS:g} ms each way)" if DELAY_MS > 0 else ""
    figure = TALLY.figure(
        f"3 replicas on postgresql{delay}, one killed",
        launches=len(accepted),
        kills=1,
        lost=lost,
        duplicated=duplicated + len(twice),
        seconds=time.monotonic() - started,
    )
    assert not crashed, crashed  # a fake daemon that died would leave its tasks to expire
    assert len(set(accepted)) == LAUNCHES and len(instances) == LAUNCHES  # lost 0, duplicated 0
    assert {i["instanceId"] for i in instances} == set(accepted)
    assert all(i["state"] == "stopped" for i in instances), Counter(i["state"] for i in instances)
    assert len(delivered) == LAUNCHES and not twice, (
        [deliveries[t] for t in twice],
        refused,
        errors[-20:],
    )
    for inst in instances:
        states = [h["state"] for h in inst["history"]]
        assert states == ["queued", "running", "stopped"], (inst["instanceId"], states)
        ats = [h["at"] for h in inst["history"]]
        assert ats == sorted(ats)
    print(f"\nreplicas: {figure} ({DAEMONS} daemons)")


async def test_a_long_poll_on_one_replica_wakes_for_work_posted_to_another(cluster: Cluster) -> None:
    await asyncio.to_thread(cluster.start)
    await asyncio.to_thread(cluster.start)
    await _setup(cluster)
    a, b = cluster.urls()
    async with client(a, cluster.daemon_token) as d, client(b, cluster.user_token) as user:
        await d.claim(daemon_id="d1", node="n1", namespaces=["jobs"], capacity=0, wait=0)  # registered
        poll = asyncio.create_task(
            d.claim(daemon_id="d1", node="n1", namespaces=["jobs"], capacity=1, wait=20)
        )
        await asyncio.sleep(0.5)
        posted = time.monotonic()
        got = await user.launch(provider="kind", mode="small", script="print(1)")
        [task] = await asyncio.wait_for(poll, 10)
        assert task["instanceId"] == got["instanceId"]
        assert time.monotonic() - posted < 2  # woken by NOTIFY, not by the 20 s wait


@pytest.mark.faults
async def test_a_database_restart_answers_503_meanwhile_and_loses_nothing(
    cluster: Cluster, pg_server: PgServer
) -> None:
    await asyncio.to_thread(cluster.start)
    await _setup(cluster)
    [url] = cluster.urls()
    async with client(url, cluster.user_token) as user, aiohttp.ClientSession() as http:
        before = [
            (await user.launch(provider="kind", mode="small", script="print(1)"))["instanceId"]
            for _ in range(5)
        ]
        await asyncio.to_thread(pg_server.stop)
        TALLY.kills += 1
        try:
            launch = f"{url}/v1/namespaces/default/providers/kind/launch"
            headers = {"Authorization": f"Bearer {cluster.user_token}"}
            t0 = time.monotonic()
            async with http.post(launch, json={"mode": "small", "script": "x"}, headers=headers) as resp:
                body = await resp.json()
            assert resp.status == 503 and body["error"] == "database_unavailable", body
            assert "retry" in body["detail"] and time.monotonic() - t0 < 8  # fails fast
        finally:
            await asyncio.to_thread(pg_server.start)
        after = None
        for _ in range(50):
            try:
                after = (await user.launch(provider="kind", mode="small", script="print(2)"))["instanceId"]
                break
            except QueueError:
                await asyncio.sleep(0.2)
        assert after is not None
        ids = {i["instanceId"] for i in await user.list_instances(provider="kind")}
        TALLY.launches += len(before) + 1
        TALLY.lost += len({*before, after} - ids)
        TALLY.duplicated += len(ids - {*before, after})
        assert ids == {*before, after}


async def test_the_direct_watches_and_reaper_run_on_one_replica_and_move_when_it_goes(
    pg_server: PgServer, tmp_path: Path
) -> None:
    from nymph.queue.direct.wiring import DIRECT
    from tests.support.queue_helpers import FAST, open_queue

    db = pg_server.fresh_database()
    opened = [await open_queue(tmp_path, FAST, db=db) for _ in range(2)]
    try:

        def running() -> list[bool]:
            return [q.app[DIRECT].watches.active for q, _ in opened]

        for _ in range(50):
            if any(running()):
                break
            await asyncio.sleep(0.1)
        assert sorted(running()) == [False, True]  # exactly one
        leader = running().index(True)
        q, runner = opened.pop(leader)
        await q.close()
        await runner.cleanup()  # its connection closes: the lock is free
        for _ in range(100):
            if running() == [True]:
                break
            await asyncio.sleep(0.1)
        assert running() == [True]  # taken over
    finally:
        for q, runner in opened:
            await q.close()
            await runner.cleanup()
        pg_server.drop_database(db)


async def test_an_instance_long_poll_on_one_replica_wakes_for_a_change_made_on_another(
    pg_server: PgServer, tmp_path: Path
) -> None:
    from tests.support.queue_helpers import FAST, add_kind, open_queue

    db = pg_server.fresh_database()
    (a, ra), (b, rb) = [await open_queue(tmp_path, FAST, db=db) for _ in range(2)]
    try:
        b.user_token = a.user_token  # one database: every replica knows every token
        await add_kind(a)
        r = await a.call(
            "POST", "/v1/namespaces/default/providers/kind/launch", json_body={"mode": "small", "script": "x"}
        )
        iid = r.body["instanceId"]
        path = f"/v1/namespaces/default/providers/kind/instances/{iid}"
        poll = asyncio.create_task(a.call("GET", f"{path}?after=1&wait=20"))
        await asyncio.sleep(0.5)
        t0 = time.monotonic()
        assert (await b.call("DELETE", path)).status == 204  # the change, on the other replica
        got = await asyncio.wait_for(poll, 10)
        assert got.status == 200 and got.body["version"] > 1 and got.body["state"] in ("stopping", "stopped")
        assert time.monotonic() - t0 < 2  # woken by NOTIFY, not by the 20 s wait
    finally:
        for q, runner in ((a, ra), (b, rb)):
            await q.close()
            await runner.cleanup()
        pg_server.drop_database(db)


async def test_a_log_follow_on_one_replica_wakes_for_a_chunk_shipped_to_another(
    pg_server: PgServer, tmp_path: Path
) -> None:
    from nymph.client.logs import follow_log
    from tests.support.queue_helpers import FAST, add_kind, open_queue

    db = pg_server.fresh_database()
    (a, ra), (b, rb) = [await open_queue(tmp_path, FAST, db=db) for _ in range(2)]
    try:
        b.user_token, b.daemon_token = a.user_token, a.daemon_token  # one database, one set of tokens
        await add_kind(a)
        r = await a.call(
            "POST", "/v1/namespaces/default/providers/kind/launch", json_body={"mode": "small", "script": "x"}
        )
        iid = r.body["instanceId"]
        shipper = b.daemon()  # the daemon that runs the instance ships its log
        [task] = await shipper.claim(daemon_id="d1", node="n1", capacity=1, wait=0)
        await shipper.complete(daemon_id="d1", task_id=task["taskId"], ok=True)
        got: list[bytes] = []
        arrived = asyncio.Event()

        def write(data: bytes) -> None:
            got.append(data)
            arrived.set()

        follower = asyncio.create_task(follow_log(a.user(), provider="kind", instance_id=iid, write=write))
        await asyncio.sleep(0.5)  # the follow has read the empty log and waits (its fallback tick is 2 s)
        t0 = time.monotonic()
        await shipper.ship_log_chunk(daemon_id="d1", instance_id=iid, offset=0, data=b"hello\n")
        await asyncio.wait_for(arrived.wait(), 5)
        assert b"".join(got) == b"hello\n"
        assert time.monotonic() - t0 < 1.0  # woken by NOTIFY, not by the follow's 2 s tick
        await shipper.ship_log_chunk(daemon_id="d1", instance_id=iid, offset=6, data=b"", final=True)
        assert await asyncio.wait_for(follower, 10) == len(b"hello\n")
    finally:
        for q, runner in ((a, ra), (b, rb)):
            await q.close()
            await runner.cleanup()
        pg_server.drop_database(db)
