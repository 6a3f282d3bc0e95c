"""A new task wakes as many waiting claims as there is work for, not every one; an idle claim
is answered from a read transaction; a task only some daemons may take still reaches one."""

from __future__ import annotations

import asyncio
import time
from fractions import Fraction
from pathlib import Path
from typing import Any, cast

import pytest

from nymph.launch.placement import NodeOffer
from nymph.queue.broadcast import coalesce, work_key
from nymph.queue.db import Backend
from nymph.queue.models import QueueSettings
from nymph.queue.notify import Ticket, WorkSignal
from nymph.queue.sql import dispatch
from nymph.queue.store import Store
from nymph.queue.wakeup import LaunchWork, claim_accepts
from tests.support.pg_server import PgServer
from tests.support.queue_helpers import FAST, Queue, add_kind, open_queue


async def _launch(q: Queue) -> str:
    accepted = await q.user().launch(provider="kind", mode="small", script="print(1)")
    return str(accepted["instanceId"])


def _count(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    calls = [0]
    real = getattr(dispatch, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(dispatch, name, counted)
    return calls


#: Node offers: ten of CPU nodes, then one of a GPU node, as daemons send them.
_CPU_NODE = {"name": "", "labels": {}, "taints": [], "allocatable": {"cpu": "8"}}
_GPU_NODE = {"name": "", "labels": {}, "taints": [], "allocatable": {"cpu": "8", "nvidia.com/gpu": "1"}}


async def _gpu_launch(q: Queue) -> str:
    accepted = await q.user().launch(
        provider="kind",
        mode="small",
        script="print(1)",
        fields={"resources": {"requests": {"nvidia.com/gpu": "1"}}},
    )
    return str(accepted["instanceId"])


def _readers(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The daemon ids of the claims that read the queue (an idle claim's read), from now on."""
    readers: list[str] = []
    real = dispatch.idle_claim

    def read(*args: Any, **kwargs: Any) -> Any:
        readers.append(kwargs["req"].daemon_id)
        return real(*args, **kwargs)

    monkeypatch.setattr(dispatch, "idle_claim", read)
    return readers


async def test_one_launch_wakes_one_of_many_waiting_claims(
    kind: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    waiting = 20
    clients = [kind.daemon() for _ in range(waiting)]
    # Each daemon registers and records itself once.
    for k, c in enumerate(clients):
        assert await c.claim(daemon_id=f"d{k}", node=f"n{k}", capacity=1, wait=0) == []
    claims = [
        asyncio.create_task(c.claim(daemon_id=f"d{k}", node=f"n{k}", capacity=1, wait=8))
        for k, c in enumerate(clients)
    ]
    await asyncio.sleep(0.5)  # every claim is holding its long-poll
    assert len(kind.store.tasks_changed) == waiting
    writes, reads = _count(monkeypatch, "claim"), _count(monkeypatch, "idle_claim")
    t0 = time.monotonic()
    iid = await _launch(kind)
    done, pending = await asyncio.wait(claims, timeout=5, return_when=asyncio.FIRST_COMPLETED)
    assert time.monotonic() - t0 < 3
    [winner] = done
    assert [t["instanceId"] for t in winner.result()] == [iid]
    await asyncio.sleep(0.3)
    # One claim woke, read, and took the task in one write transaction; the others slept on.
    assert writes[0] == 1 and reads[0] <= 2
    assert not any(t.done() for t in pending)
    assert len(kind.store.tasks_changed) == waiting - 1
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


async def test_a_task_only_one_daemon_may_take_reaches_it_past_the_others(kind: Queue) -> None:
    # Five daemons serving another namespace queue up first; the one that serves "jobs" is last.
    others = [kind.daemon() for _ in range(5)]
    for k, c in enumerate(others):
        assert await c.claim(daemon_id=f"o{k}", node=f"o{k}", namespaces=["other"], capacity=1, wait=0) == []
    right = kind.daemon()
    assert await right.claim(daemon_id="r", node="r", namespaces=["jobs"], capacity=1, wait=0) == []
    waits = [
        asyncio.create_task(
            c.claim(daemon_id=f"o{k}", node=f"o{k}", namespaces=["other"], capacity=1, wait=8)
        )
        for k, c in enumerate(others)
    ]
    await asyncio.sleep(0.3)
    mine = asyncio.create_task(right.claim(daemon_id="r", node="r", namespaces=["jobs"], capacity=1, wait=8))
    await asyncio.sleep(0.3)
    t0 = time.monotonic()
    iid = await _launch(kind)
    got = await asyncio.wait_for(mine, 5)
    assert [t["instanceId"] for t in got] == [iid]
    assert time.monotonic() - t0 < 3  # handed along the line, not found at the 8 s timeout
    assert not any(t.done() for t in waits)
    for t in waits:
        t.cancel()
    await asyncio.gather(*waits, return_exceptions=True)


async def test_a_launch_only_some_nodes_can_run_wakes_only_their_claims(
    kind: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ten daemons on CPU nodes wait first, one on a GPU node last: a launch that asks for a GPU
    wakes the GPU node's claim alone (the others are never woken to read), and a launch any node
    can run still wakes the first in line."""
    daemons = [(f"c{k}", kind.daemon(), dict(_CPU_NODE, name=f"c{k}")) for k in range(10)]
    daemons.append(("g", kind.daemon(), dict(_GPU_NODE, name="g")))
    for name, c, offer in daemons:
        assert await c.claim(daemon_id=name, node=name, capacity=1, wait=0, node_info=offer) == []

    def hold(name: str, c: Any, offer: dict[str, Any]) -> asyncio.Task[Any]:
        return asyncio.create_task(c.claim(daemon_id=name, node=name, capacity=1, wait=8, node_info=offer))

    waits = {}
    for name, c, offer in daemons:
        waits[name] = hold(name, c, offer)
        await asyncio.sleep(0.05)  # in line in this order
    await asyncio.sleep(0.3)
    readers = _readers(monkeypatch)
    gpu_job = await _gpu_launch(kind)
    got = await asyncio.wait_for(waits.pop("g"), 5)
    assert [t["instanceId"] for t in got] == [gpu_job]
    await asyncio.sleep(0.3)
    assert set(readers) <= {"g"}, readers  # no CPU node's claim was woken to read
    assert not any(t.done() for t in waits.values())
    iid = await _launch(kind)
    done, _ = await asyncio.wait(waits.values(), timeout=5, return_when=asyncio.FIRST_COMPLETED)
    [first] = done
    assert first is waits["c0"] and [t["instanceId"] for t in first.result()] == [iid]
    for t in waits.values():
        t.cancel()
    await asyncio.gather(*waits.values(), return_exceptions=True)


async def test_an_idle_claim_writes_nothing(kind: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    d = kind.daemon()
    assert await d.claim(daemon_id="d1", node="n1", capacity=1, wait=0) == []
    writes = _count(monkeypatch, "claim")
    for _ in range(5):
        assert await d.claim(daemon_id="d1", node="n1", capacity=1, wait=0) == []
    assert writes[0] == 0
    # Work, or a changed offer (capacity), takes the write path.
    await _launch(kind)
    assert len(await d.claim(daemon_id="d1", node="n1", capacity=2, wait=0)) == 1
    assert writes[0] == 1


async def _last_seen(q: Queue) -> dict[str, float]:
    rows = await q.store.db.read(
        lambda conn: conn.execute("SELECT daemon_id, last_seen FROM daemons").fetchall()
    )
    return {str(r[0]): float(r[1]) for r in rows}


async def test_an_idle_claim_due_a_refresh_writes_nothing_and_the_refresh_lands_in_a_batch(
    kind: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A daemon's record is refreshed a minute after it was written; an idle claim that finds it
    due still answers from a read, and the refreshes of every such claim are written together a
    few seconds later, by the replica's own loop."""
    daemons = [kind.daemon() for _ in range(3)]
    for k, d in enumerate(daemons):
        assert await d.claim(daemon_id=f"d{k}", node=f"n{k}", capacity=1, wait=0) == []
    before = await _last_seen(kind)
    monkeypatch.setattr(dispatch, "_SEEN_REFRESH", 0.0)  # every record is due from now on
    writes, batches = _count(monkeypatch, "claim"), _count(monkeypatch, "refresh_seen")
    for k, d in enumerate(daemons):
        assert await d.claim(daemon_id=f"d{k}", node=f"n{k}", capacity=1, wait=0) == []
    assert writes[0] == 0, "an idle claim took the write path"
    deadline = time.monotonic() + 15
    while (after := await _last_seen(kind)) == before:
        assert time.monotonic() < deadline, "the refreshes were never written"
        await asyncio.sleep(0.2)
    assert set(after) == set(before) and all(after[d] > before[d] for d in before)
    assert batches[0] == 1
    assert await kind.store.flush_seen() == 0  # nothing left due


async def test_a_refresh_batch_moves_only_records_it_is_newer_than(kind: Queue) -> None:
    d = kind.daemon()
    assert await d.claim(daemon_id="d1", node="n1", capacity=1, wait=0) == []
    assert await d.claim(daemon_id="d2", node="n2", capacity=1, wait=0) == []
    seen = await _last_seen(kind)
    due = {"d1": seen["d1"] + 5, "d2": seen["d2"] - 5, "gone": seen["d1"] + 5}
    await kind.store.db.write(lambda conn: dispatch.refresh_seen(conn, due))
    after = await _last_seen(kind)
    assert after == {"d1": seen["d1"] + 5, "d2": seen["d2"]}, "a later record went back, or one came back"


# --- the signal itself ------------------------------------------------------------------------


def test_notify_wakes_as_many_as_asked_first_come_first_woken() -> None:
    s = WorkSignal()
    tickets = [s.ticket() for _ in range(4)]
    s.notify(2)
    assert [t.event.is_set() for t in tickets] == [True, True, False, False]
    assert tickets[0].wake == 4 and len(s) == 2
    s.notify(5)  # more work than waiters: every one left is woken
    assert all(t.event.is_set() for t in tickets) and len(s) == 0


def test_a_wake_is_handed_on_within_its_budget_and_a_finished_waiter_leaves_the_line() -> None:
    s = WorkSignal()
    a, b, c = s.ticket(), s.ticket(), s.ticket()
    assert s.finish(b) is None and len(s) == 2  # timed out: gone from the line
    s.notify(1)
    assert s.finish(a) == 2  # the waiter count when the work came
    s.pass_on(2)
    assert c.event.is_set() and c.wake == 1
    d = s.ticket()
    s.pass_on(0)  # budget spent: nobody else is woken
    assert not d.event.is_set()


def test_a_thousand_waiters_timing_out_leave_the_line_and_a_wake_still_finds_the_live_ones() -> None:
    """Finished waiters count no more in the line (nor in a wake's budget) and are never woken,
    however many finish before the ones still waiting; the line does not keep them."""
    s = WorkSignal()
    tickets = [s.ticket() for _ in range(1000)]
    for t in tickets[:990] + tickets[995:]:
        assert s.finish(t) is None
    assert len(s) == 5 and len(s._line) < 100  # swept once they outnumbered the live ones
    s.notify(3)
    assert [t.event.is_set() for t in tickets[990:995]] == [True, True, True, False, False]
    assert tickets[990].wake == 5
    assert not any(t.event.is_set() for t in tickets[:990] + tickets[995:])
    assert s.finish(tickets[993]) is None and len(s) == 1
    s.notify(1)
    assert tickets[994].event.is_set() and len(s) == 0


def test_close_wakes_everyone_in_line_and_aside_and_later_tickets_at_once() -> None:
    s = WorkSignal()
    in_line, aside = s.ticket(), s.ticket(in_line=False)
    s.notify(1)
    assert in_line.event.is_set() and not aside.event.is_set()  # capacity 0 takes no work
    s.close()
    assert aside.event.is_set() and s.ticket().event.is_set()


def test_notify_is_relayed_with_its_count_and_a_wake_from_elsewhere_is_not_relayed_again() -> None:
    relayed: list[tuple[int | None, object]] = []

    def relay(count: int | None, item: object) -> None:
        relayed.append((count, item))

    s = WorkSignal(relay=relay)
    tickets = [s.ticket() for _ in range(3)]
    s.notify(2)
    s.notify(1, item="gpu")
    s.notify_all()
    assert relayed == [(2, None), (1, "gpu"), (None, None)]
    s2 = WorkSignal(relay=relay)
    there = [s2.ticket() for _ in range(3)]
    s2.wake(1)  # another replica's notify arriving here
    assert [t.event.is_set() for t in there] == [True, False, False]
    s2.wake_all()
    assert all(t.event.is_set() for t in there) and all(t.event.is_set() for t in tickets)
    assert relayed == [(2, None), (1, "gpu"), (None, None)]


class _FakeBackend:
    relays = True

    def __init__(self) -> None:
        self.sent: list[str] = []

    def broadcast(self, key: str) -> None:
        self.sent.append(key)


def test_broadcast_keys_wake_the_right_waiters_on_another_replica() -> None:
    here, there = _FakeBackend(), _FakeBackend()
    settings = QueueSettings()
    a = Store(db=cast(Backend, here), settings=settings)
    b = Store(db=cast(Backend, there), settings=settings)
    a.tasks_changed.notify(3)
    a.instance_changed.notify("i-1")
    a.output.appended.notify("i-2")
    assert here.sent == ["tasks:3", "i-1", "log:i-2"]
    claims = [b.tasks_changed.ticket() for _ in range(4)]
    inst, log_ = b.instance_changed.current("i-1"), b.output.appended.current("i-2")
    other = b.output.appended.current("i-3")
    for key in here.sent:
        b.woken_elsewhere(key)
    assert [t.event.is_set() for t in claims] == [True, True, True, False]
    assert inst.is_set() and log_.is_set() and not other.is_set()
    b.woken_elsewhere("")  # a listener that reconnected: everything may have changed
    assert claims[3].event.is_set() and other.is_set()
    assert there.sent == []  # wake-ups from elsewhere are never sent on


def test_keys_sent_together_wake_what_they_would_have_woken_one_by_one() -> None:
    """Broadcast keys batched while a send was under way add their task counts up and keep every
    other key once, so the other replica wakes the same claims and waiters as before."""
    keys = ["tasks:2", "i-1", "events:team-a", "tasks:3", "i-1", "log:i-2", "events:team-a"]
    assert coalesce(keys) == ["tasks:5", "i-1", "events:team-a", "log:i-2"]
    assert coalesce(["i-1", "tasks:1", "tasks:"]) == ["tasks:", "i-1"]  # every claim: absorbs the counts
    assert coalesce(["i-1", "", "tasks:1"]) == [""]  # everything: the others add nothing
    assert coalesce(["i-1"]) == ["i-1"]
    b = Store(db=cast(Backend, _FakeBackend()), settings=QueueSettings())
    claims = [b.tasks_changed.ticket() for _ in range(6)]
    for key in coalesce(keys):
        b.woken_elsewhere(key)
    assert [t.event.is_set() for t in claims] == [True] * 5 + [False]


async def test_a_long_poll_that_runs_out_unwoken_reads_once(
    kind: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long-poll that nothing woke ends at its deadline without reading the queue again (the
    daemon claims again at once; a thousand daemons' holds run out twenty times a second), and
    one that a task woke still takes it."""
    d = kind.daemon()
    assert await d.claim(daemon_id="d1", node="n1", capacity=1, wait=0) == []
    reads, writes = _count(monkeypatch, "idle_claim"), _count(monkeypatch, "claim")
    t0 = time.monotonic()
    assert await d.claim(daemon_id="d1", node="n1", capacity=1, wait=0.6) == []
    assert time.monotonic() - t0 >= 0.5
    assert (reads[0], writes[0]) == (1, 0)
    held = asyncio.create_task(d.claim(daemon_id="d1", node="n1", capacity=1, wait=5))
    await asyncio.sleep(0.3)
    iid = await _launch(kind)
    assert [t["instanceId"] for t in await asyncio.wait_for(held, 4)] == [iid]


def test_a_wake_skips_waiters_that_read_after_its_work_came() -> None:
    """A waiter whose ticket was taken after a notify has read that notify's work (its claim
    reads after taking the ticket): a wake for that work handed on passes it by, and stops at
    the first such waiter, since every waiter behind it took its ticket later still."""
    s = WorkSignal()
    a, b = s.ticket(), s.ticket()
    s.notify(1)
    assert a.event.is_set() and a.wake_for == 1
    late = s.ticket()  # taken after the notify: it reads the work itself
    budget = s.finish(a)
    assert budget == 2
    s.pass_on(budget, a.wake_for)
    assert b.event.is_set() and b.wake_for == 1  # taken before the notify: woken
    s.pass_on(s.finish(b) or 0, b.wake_for)
    assert not late.event.is_set() and len(s) == 1  # read after the work came: left waiting
    s.notify(1)  # new work: it has not seen that
    assert late.event.is_set() and late.wake_for == 2


def _woken_reads(s: WorkSignal, waiters: list[Ticket]) -> int:
    """Every woken waiter finds nothing it can take, as a claim does: it takes a new ticket
    (before its read), reads, and hands its wake on. The reads, until no waiter is woken."""
    reads = 0
    while True:
        woken = [i for i, t in enumerate(waiters) if t.event.is_set() and not t.done]
        if not woken:
            return reads
        for i in woken:
            t = waiters[i]
            budget = s.finish(t)
            waiters[i] = s.ticket()
            reads += 1
            s.pass_on(budget or 0, t.wake_for)


def test_a_burst_of_work_nobody_can_take_costs_each_waiter_a_read_not_one_per_task() -> None:
    """500 tasks no waiter can take, notified while none of 1,000 waiters has read yet: each
    waiter reads once (its read sees all 500), not once per task (half a million reads: each
    task's wake travelled through every waiter). Work that comes after they read wakes them
    again."""
    s = WorkSignal()
    waiters = [s.ticket() for _ in range(1000)]
    for _ in range(500):
        s.notify(1)
    assert _woken_reads(s, waiters) == 1000
    assert len(s) == 1000
    s.notify(1)
    assert _woken_reads(s, waiters) == 1000  # one task none can take still visits each once


def test_a_wake_for_work_a_waiter_may_not_take_passes_it_by_and_it_keeps_its_place() -> None:
    """A notify that says what its work is wakes the first waiter that may take it; the ones
    it passes by keep their place in line, first for the next work they may take. A notify that
    does not say (a relayed one, other kinds of work) wakes the first in line."""
    s = WorkSignal()
    odd = s.ticket(accepts=lambda item: item % 2 == 1)
    even = s.ticket(accepts=lambda item: item % 2 == 0)
    anything = s.ticket()
    s.notify(1, item=2)
    assert (odd.event.is_set(), even.event.is_set(), anything.event.is_set()) == (False, True, False)
    assert even.wake_item == 2
    s.finish(even)
    s.notify(1, item=4)  # nobody left who takes only even work: the one that takes anything
    assert anything.event.is_set() and not odd.event.is_set()
    s.finish(anything)
    s.notify(1, item=6)  # nobody may take it: nobody is woken, the budget is not spent on reads
    assert not odd.event.is_set() and len(s) == 1
    s.notify(1)  # not told what it is: the first in line
    assert odd.event.is_set()


def test_a_handed_on_wake_keeps_its_work_and_skips_who_may_not_take_it() -> None:
    s = WorkSignal()
    first = s.ticket(accepts=lambda item: item == "x")
    other = s.ticket(accepts=lambda item: item == "y")
    second = s.ticket(accepts=lambda item: item == "x")
    s.notify(1, item="x")
    assert first.event.is_set() and first.wake_item == "x"
    budget = s.finish(first)
    s.pass_on(budget or 0, first.wake_for, first.wake_item)  # it found nothing after all
    assert second.event.is_set() and not other.event.is_set()


def test_a_launchs_wake_is_relayed_with_what_it_needs_and_wakes_only_who_may_take_it() -> None:
    """A launch's wake travels to the other replicas with its kube namespace and needs: there it
    wakes the first claim that may take it, past the ones that may not, which keep their place."""
    here, there = _FakeBackend(), _FakeBackend()
    a = Store(db=cast(Backend, here), settings=QueueSettings())
    b = Store(db=cast(Backend, there), settings=QueueSettings())
    spec = {"namespace": "jobs", "script": "print(1)", "resources": {"requests": {"nvidia.com/gpu": "1"}}}
    a.tasks_changed.notify(1, item=LaunchWork(kube_namespace="jobs", spec=spec))
    [key] = here.sent
    assert key.startswith("tasks:1@") and "print(1)" not in key  # its needs, not its script
    cpu = NodeOffer(name="c", allocatable={"cpu": Fraction(8)})
    gpu = NodeOffer(name="g", allocatable={"cpu": Fraction(8), "nvidia.com/gpu": Fraction(1)})
    cpus = [b.tasks_changed.ticket(accepts=claim_accepts(namespaces=("jobs",), offer=cpu)) for _ in range(3)]
    other_ns = b.tasks_changed.ticket(accepts=claim_accepts(namespaces=("web",), offer=gpu))
    right = b.tasks_changed.ticket(accepts=claim_accepts(namespaces=("jobs",), offer=gpu))
    b.woken_elsewhere(key)
    assert right.event.is_set() and right.wake_item is not None
    assert not any(t.event.is_set() for t in [*cpus, other_ns]) and len(b.tasks_changed) == 4
    b.woken_elsewhere("tasks:1")  # a count alone (an older replica, other work): the first in line
    assert cpus[0].event.is_set()
    b.woken_elsewhere("tasks:1@{not json")  # what it cannot read: any claim, never no one
    assert cpus[1].event.is_set()
    b.woken_elsewhere("tasks:\u00b2")  # not a count: every claim, and no error
    assert all(t.event.is_set() for t in [*cpus, other_ns])


def test_relayed_launch_wakes_sent_together_keep_their_kinds_of_work_apart() -> None:
    gpu, plain = (
        LaunchWork(kube_namespace="jobs", spec={"resources": {"limits": {"nvidia.com/gpu": "1"}}}),
        LaunchWork(kube_namespace="jobs", spec={}),
    )
    g, p = work_key(1, gpu), work_key(1, plain)
    assert g != p and g.startswith("tasks:1@") and p.startswith("tasks:1@")
    assert coalesce([g, "tasks:2", p, g, "i-1", g]) == ["tasks:2", work_key(3, gpu), p, "i-1"]
    assert coalesce([g, "tasks:", p]) == ["tasks:"]  # every claim: what each is adds nothing
    assert coalesce([g, ""]) == [""]
    assert coalesce(["tasks:\u00b2", "i-1"]) == ["tasks:", "i-1"]  # not a count: every claim
    b = Store(db=cast(Backend, _FakeBackend()), settings=QueueSettings())
    offer = NodeOffer(name="g", allocatable={"nvidia.com/gpu": Fraction(1)})
    claims = [b.tasks_changed.ticket(accepts=claim_accepts(namespaces=(), offer=offer)) for _ in range(5)]
    for key in coalesce([g, g, g]):
        b.woken_elsewhere(key)
    assert [t.event.is_set() for t in claims] == [True] * 3 + [False] * 2


async def test_a_launch_posted_to_one_replica_wakes_only_the_claims_on_another_that_may_take_it(
    pg_server: PgServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two replicas on one PostgreSQL database: a GPU launch POSTed to the first wakes, on the
    second, the GPU node's claim alone; ten CPU nodes' claims waiting before it never read."""
    url = pg_server.fresh_database()
    a, runner_a = await open_queue(tmp_path, FAST, db=url)
    b, runner_b = await open_queue(tmp_path, FAST, db=url)
    waits: dict[str, asyncio.Task[Any]] = {}
    try:
        await add_kind(a)
        daemons = [(f"c{k}", b.daemon(), dict(_CPU_NODE, name=f"c{k}")) for k in range(10)]
        daemons.append(("g", b.daemon(), dict(_GPU_NODE, name="g")))
        for name, c, offer in daemons:
            assert await c.claim(daemon_id=name, node=name, capacity=1, wait=0, node_info=offer) == []
        for name, c, offer in daemons:
            waits[name] = asyncio.create_task(
                c.claim(daemon_id=name, node=name, capacity=1, wait=15, node_info=offer)
            )
            await asyncio.sleep(0.05)  # in line in this order
        await asyncio.sleep(0.3)
        assert len(b.store.tasks_changed) == 11
        readers = _readers(monkeypatch)
        t0 = time.monotonic()
        gpu_job = await _gpu_launch(a)
        got = await asyncio.wait_for(waits.pop("g"), 10)
        assert [t["instanceId"] for t in got] == [gpu_job]
        assert time.monotonic() - t0 < 5  # woken through the database, not at the hold's end
        await asyncio.sleep(0.3)
        assert set(readers) <= {"g"}, readers  # no CPU node's claim was woken to read
        assert not any(t.done() for t in waits.values())
    finally:
        for t in waits.values():
            t.cancel()
        await asyncio.gather(*waits.values(), return_exceptions=True)
        for q, runner in ((a, runner_a), (b, runner_b)):
            await q.close()
            await runner.cleanup()
        pg_server.drop_database(url)


def test_a_stream_of_launches_no_node_there_can_run_costs_another_replica_no_read() -> None:
    """Launches POSTed one by one to one replica, none of which a node on the other can run:
    there, each arrives as its own wake (a new notify every waiter has not seen yet), and one
    that said only its count would wake every waiter in turn, one read each. Told what each
    launch needs, the other replica wakes no one."""

    def reads(relay_items: bool) -> int:
        here, there = _FakeBackend(), _FakeBackend()
        a = Store(db=cast(Backend, here), settings=QueueSettings())
        b = Store(db=cast(Backend, there), settings=QueueSettings())
        cpu = NodeOffer(name="c", allocatable={"cpu": Fraction(8)})
        accepts = claim_accepts(namespaces=("jobs",), offer=cpu)
        waiters = [b.tasks_changed.ticket(accepts=accepts) for _ in range(200)]
        total = 0
        for _ in range(50):
            work = LaunchWork(kube_namespace="jobs", spec={"resources": {"requests": {"cpu": "64"}}})
            a.tasks_changed.notify(1, item=work)
            key = here.sent.pop()
            b.woken_elsewhere(key if relay_items else key.partition("@")[0])
            while True:  # each woken claim reads, finds nothing, waits again and hands the wake on
                woken = [i for i, t in enumerate(waiters) if t.event.is_set() and not t.done]
                if not woken:
                    break
                for i in woken:
                    t = waiters[i]
                    budget = b.tasks_changed.finish(t)
                    waiters[i] = b.tasks_changed.ticket(accepts=accepts)
                    total += 1
                    b.tasks_changed.pass_on(budget or 0, t.wake_for, t.wake_item)
        return total

    assert reads(relay_items=False) == 50 * 200
    assert reads(relay_items=True) == 0
