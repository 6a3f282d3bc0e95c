"""Live logs and output that outlive the Pod, on the real node (kubelet logs, real exit codes).

A job prints for several seconds while the test follows its log through the queue; the daemon
is killed (-9) and restarted, then the queue; the followed log, the stored log after the Pod is
reaped and the exit code must be exactly what the job printed and returned.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from nymph.client.logs import follow_log
from nymph.client.results import download, list_results
from nymph.localcluster import LocalCluster
from tests.launch.test_real_node import python_image
from tests.support.apicount import log_requests
from tests.support.harness import (
    DaemonProc,
    QueueProc,
    daemon_kubeconfig,
    launch,
    pods,
    setup_provider,
    wait_state,
)

pytestmark = pytest.mark.e2e

LINES = 500
SCRIPT = f"""
import os, sys, time
os.makedirs("out/sub", exist_ok=True)
with open("out/result.txt", "w") as fh:
    fh.write("the answer is 42\\n")
with open("out/sub/data.bin", "wb") as fh:
    fh.write(bytes(range(256)) * 1000)
os.symlink("/etc/passwd", "out/passwd")
for i in range({LINES}):
    sys.stdout.write("line %05d %s\\n" % (i, "z" * (i % 50)))
    if i == 100:
        sys.stdout.write("L" * 40000 + "\\n")
    sys.stdout.flush()
    time.sleep(0.02)
sys.stdout.write("no newline at the end")
sys.stdout.flush()
sys.exit(3)
"""


def printed() -> bytes:
    out = []
    for i in range(LINES):
        out.append(b"line %05d %s\n" % (i, b"z" * (i % 50)))
        if i == 100:
            out.append(b"L" * 40000 + b"\n")
    out.append(b"no newline at the end")
    return b"".join(out)


class RealStack:
    def __init__(self, kube: LocalCluster, namespace: str, tmp: Path, *, extra: tuple[str, ...] = ()) -> None:
        self.kube = kube
        self.extra = extra
        self.namespace = namespace
        self.queue = QueueProc(tmp / "queue.db")
        self.kubeconfig = daemon_kubeconfig(kube, namespace, tmp)
        self.root = tmp / "root"
        self.daemons: list[DaemonProc] = []

    def daemon(self) -> DaemonProc:
        assert self.kube.real_node is not None
        d = DaemonProc(
            self.queue,
            self.kubeconfig,
            self.namespace,
            self.root,
            extra=("--reap-after", "2", *self.extra),
            node=self.kube.real_node,
        )
        self.daemons.append(d)
        return d.start()

    def kill_all(self) -> None:
        for d in self.daemons:
            d.kill()
        self.queue.kill()


@pytest.fixture
def real_stack(real_kube: LocalCluster, real_namespace: str, tmp_path: Path) -> Iterator[RealStack]:
    s = RealStack(real_kube, real_namespace, tmp_path)
    try:
        s.queue.tokens()
        s.queue.start()
        asyncio.run(setup_provider(s.queue, real_namespace, image=python_image(real_kube)))
        s.daemon()
        yield s
    finally:
        s.kill_all()


@pytest.mark.realnode
async def test_a_log_followed_live_survives_daemon_and_queue_restarts(real_stack: RealStack) -> None:
    s = real_stack
    expected = printed()
    iid = await launch(s.queue, script=SCRIPT)
    got: list[bytes] = []
    async with s.queue.client() as client:
        follower = asyncio.create_task(
            follow_log(client, provider="local", instance_id=iid, write=got.append, retries=60)
        )
        # Live: output arrives while the job still runs.
        deadline = time.monotonic() + 90
        while sum(map(len, got)) < 200 and time.monotonic() < deadline:
            assert not follower.done(), follower
            await asyncio.sleep(0.1)
        inst = await client.get_instance(provider="local", instance_id=iid)
        assert inst["state"] == "running" and 0 < sum(map(len, got)) < len(expected)

        await asyncio.to_thread(s.daemons[-1].kill)
        await asyncio.sleep(1.0)
        await asyncio.to_thread(s.daemon)
        await asyncio.sleep(1.5)
        await asyncio.to_thread(s.queue.kill)
        await asyncio.sleep(0.5)
        await asyncio.to_thread(s.queue.start)

        reached = await asyncio.wait_for(follower, 120)
        assert b"".join(got) == expected
        assert reached == len(expected)

    inst = await wait_state(s.queue, iid, {"stopped"}, timeout=60)
    assert inst["reason"] == "Error" and inst.get("exitCode") == 3, inst
    # reaped: the Pod is gone, the log and the exit code are still there
    deadline = time.monotonic() + 60
    while [p for p in pods(s.kube, s.namespace) if p["metadata"]["name"] == iid]:
        assert time.monotonic() < deadline, "the finished Pod was not reaped"
        await asyncio.sleep(0.5)
    async with s.queue.client() as client:
        logs = await client.get_logs(provider="local", instance_id=iid)
        assert logs is not None and logs.encode() == expected
        inst = await client.get_instance(provider="local", instance_id=iid)
        assert inst.get("exitCode") == 3
        # results: the regular files the job wrote, the symlink refused and said so
        listed = await list_results(client, provider="local", instance_id=iid)
        assert listed["items"] == [
            {"path": "result.txt", "size": 17},
            {"path": "sub/data.bin", "size": 256000},
        ]
        assert "passwd: a symlink" in (listed["error"] or "") and "passwd" in inst.get("resultsError", "")
        got_dir = s.root.parent / "downloaded"
        for item in listed["items"]:
            await download(client, provider="local", instance_id=iid, path=item["path"], directory=got_dir)
        assert (got_dir / "result.txt").read_bytes() == b"the answer is 42\n"
        assert (got_dir / "sub" / "data.bin").read_bytes() == bytes(range(256)) * 1000


@asynccontextmanager
async def _two_kwok_jobs(
    kube: LocalCluster, namespace: str, tmp_path: Path, *, extra: tuple[str, ...] = ()
) -> AsyncIterator[tuple[QueueProc, list[str], int]]:
    """A queue and a daemon on the kwok node, and two one-second launches run there to their
    end, one after the other: (the queue, their instance ids, the API server's log requests
    before them)."""
    q = QueueProc(tmp_path / "queue.db")
    d = DaemonProc(q, daemon_kubeconfig(kube, namespace, tmp_path), namespace, tmp_path / "root", extra=extra)
    try:
        q.tokens()
        q.start()
        await setup_provider(q, namespace)
        d.start()
        before = log_requests(kube)
        iids = []
        for _ in range(2):
            iid = await launch(q, tags={"sim.nymph.io/run": "1s"})
            await wait_state(q, iid, {"stopped"}, timeout=60)
            iids.append(iid)
        yield q, iids, before
    finally:
        d.kill()
        q.kill()


async def test_on_a_kwok_node_the_follower_stops_at_once(
    kube: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    """No kubelet, no container log: the follower notices on the first answer, ships a final
    chunk with a note, and never asks again; a followed log ends at once. The node lists no
    address, so the next Pod on it is not asked for a log at all, and its log ends at once too."""
    async with _two_kwok_jobs(kube, namespace, tmp_path) as (q, iids, before):
        async with q.client() as client:
            for iid in iids:
                got: list[bytes] = []
                await asyncio.wait_for(
                    follow_log(client, provider="local", instance_id=iid, write=got.append), 30
                )
                assert got == []
        await asyncio.sleep(3)  # a looping follower would have asked again by now
        lines = (tmp_path / "daemon-root.log").read_text().splitlines()
        asked = [ln for ln in lines if "serves no container log" in ln]
        assert len(asked) == 1 and iids[0] in asked[0], asked
        assert log_requests(kube) - before == 1


async def test_on_a_kwok_node_reaping_reads_no_log_tail(
    kube: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    """A Pod on a node that serves no log is reaped without a tail read, which would be refused
    as its follower was: reaping two Pods adds no log request to the first follower's one, and
    their logs stay as followed (empty, ended), with no refusal stored in their place."""
    async with _two_kwok_jobs(kube, namespace, tmp_path, extra=("--reap-after", "1")) as (q, iids, before):
        deadline = time.monotonic() + 60
        while [p for p in pods(kube, namespace) if p["metadata"]["name"] in iids]:
            assert time.monotonic() < deadline, "the finished Pods were not reaped"
            await asyncio.sleep(0.5)
        assert log_requests(kube) - before == 1
        async with q.client() as client:
            for iid in iids:
                assert await client.get_logs(provider="local", instance_id=iid) == ""
