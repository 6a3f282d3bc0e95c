"""Launch POSTs that arrive together are written together on PostgreSQL, and each keeps its own
answer: its own instance and task, its own error when it is refused, and a write sent again
launch by launch when the batch's write fails; never a launch written twice or lost."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from nymph.queue.errors import BadRequest, NotFound, ServiceError, Unavailable
from nymph.queue.launchbatch import Accepted, BatchKey, LaunchBatcher
from nymph.queue.models import Principal, Role
from nymph.queue.pgdb import OUTCOME_UNKNOWN
from nymph.queue.sql import launches
from nymph.queue.sql.launches import BatchLaunch, BatchOutcome
from nymph.queue.store import Store
from tests.support.queue_helpers import Queue

ALICE = Principal(token_id="t-alice", role=Role.USER, name="alice")
KEY = BatchKey(ns="default", provider="kind", mode="small")


def _store(q: Queue) -> Store:
    from nymph.queue.http.app import STORE

    return q.app[STORE]


def _launch(store: Store, k: int, **fields: Any) -> Any:
    body = {"mode": fields.pop("mode", "small"), "script": f"print({k})", **fields}
    return store.launch(ns="default", provider="kind", body=body, idempotency_key=None, principal=ALICE)


async def _rows(store: Store, sql: str) -> list[Any]:
    return await store.db.read(lambda conn: [tuple(r) for r in conn.execute(sql).fetchall()])


@pytest.mark.postgresql_only
async def test_launches_sent_together_share_one_write_and_each_has_its_own_instance_and_task(
    kind: Queue,
) -> None:
    store = _store(kind)
    batcher = store._launch_batches
    answers = await asyncio.gather(*(_launch(store, k) for k in range(16)))
    assert (batcher.batches, batcher.launches) == (1, 16)
    ids = [a["instanceId"] for a in answers]
    assert len(set(ids)) == 16
    assert all(a["state"] == "queued" for a in answers)
    tasks = await _rows(
        store, "SELECT instance_id, spec FROM tasks WHERE kind = 'launch' ORDER BY created_at"
    )
    assert sorted(t[0] for t in tasks) == sorted(ids)
    # each task runs its own launch's script
    scripts = {t[0]: t[1] for t in tasks}
    for k, iid in enumerate(ids):
        assert f"print({k})" in scripts[iid]
    events = await _rows(store, "SELECT instance_id FROM events")
    assert sorted(e[0] for e in events) == sorted(ids)
    history = await _rows(store, "SELECT instance_id FROM instance_events")
    assert sorted(h[0] for h in history) == sorted(ids)
    # a daemon claims every one of them
    got = await kind.daemon().claim(daemon_id="d1", node="n1", capacity=16, wait=0)
    assert sorted(t["instanceId"] for t in got) == sorted(ids)
    # the replica's metrics count the batch and its launches
    metrics = (await kind.call("GET", "/metrics", token=kind.admin_token)).text
    assert "nymph_queue_launch_batch_launches_count 1.0" in metrics
    assert "nymph_queue_launch_batch_launches_sum 16.0" in metrics


@pytest.mark.postgresql_only
async def test_launches_posted_at_once_over_http_are_all_accepted_in_fewer_writes(kind: Queue) -> None:
    """Sixteen POSTs at once: sixteen 202s, sixteen instances, fewer writes than launches."""
    store = _store(kind)
    before = store._launch_batches.batches
    user = kind.user()
    answers = await asyncio.gather(
        *(user.launch(provider="kind", mode="small", script=f"print({k})") for k in range(16))
    )
    assert len({a["instanceId"] for a in answers}) == 16
    assert store._launch_batches.launches >= 16
    assert store._launch_batches.batches - before < 16
    listed = await user.list_instances(provider="kind")
    assert {i["instanceId"] for i in listed} == {a["instanceId"] for a in answers}


@pytest.mark.postgresql_only
async def test_a_refused_launch_is_answered_alone_and_the_rest_of_its_batch_is_written(
    kind: Queue,
) -> None:
    store = _store(kind)
    bad = {"fields": {"gpu": 1}}  # no such launch field
    got = await asyncio.gather(
        *(_launch(store, k, **(bad if k == 3 else {})) for k in range(8)), return_exceptions=True
    )
    assert store._launch_batches.batches == 1
    assert isinstance(got[3], BadRequest) and got[3].status == 400
    good = [g for k, g in enumerate(got) if k != 3]
    assert all(isinstance(g, dict) for g in good)
    instances = await _rows(store, "SELECT instance_id FROM instances")
    assert sorted(i[0] for i in instances) == sorted(g["instanceId"] for g in good)  # type: ignore[index]
    assert len(await _rows(store, "SELECT task_id FROM tasks")) == 7


@pytest.mark.postgresql_only
async def test_a_missing_mode_is_every_launch_s_answer_and_nothing_is_written(kind: Queue) -> None:
    store = _store(kind)
    got = await asyncio.gather(*(_launch(store, k, mode="nope") for k in range(4)), return_exceptions=True)
    assert all(isinstance(g, NotFound) for g in got)
    assert len({id(g) for g in got}) == 4  # each caller raises its own
    assert await _rows(store, "SELECT instance_id FROM instances") == []


@pytest.mark.postgresql_only
async def test_a_batch_whose_write_fails_is_sent_again_launch_by_launch(
    kind: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that fails for a reason of no launch in particular is not every launch's
    failure: each is written alone, once."""
    store = _store(kind)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the batch write broke")

    monkeypatch.setattr(launches, "launch_batch", broken)
    answers = await asyncio.gather(*(_launch(store, k) for k in range(5)))
    assert store._launch_batches.batches == 0
    instances = await _rows(store, "SELECT instance_id FROM instances")
    assert sorted(i[0] for i in instances) == sorted(a["instanceId"] for a in answers)
    assert len(await _rows(store, "SELECT task_id FROM tasks")) == 5


@pytest.mark.postgresql_only
async def test_a_keyed_launch_is_not_batched_and_replays_its_first_answer(kind: Queue) -> None:
    store = _store(kind)
    body = {"mode": "small", "script": "print(1)"}
    first = await store.launch(
        ns="default", provider="kind", body=body, idempotency_key="k1", principal=ALICE
    )
    again = await store.launch(
        ns="default", provider="kind", body=body, idempotency_key="k1", principal=ALICE
    )
    assert first == again
    assert store._launch_batches.launches == 0
    assert len(await _rows(store, "SELECT task_id FROM tasks")) == 1


# --- the batcher alone (its writes are functions of the test) -------------------------------


class _Writes:
    """Records what the batcher writes, and answers as told."""

    def __init__(self, *, batch_error: BaseException | None = None) -> None:
        self.batches: list[list[str]] = []
        self.alone: list[str] = []
        self.batch_error = batch_error

    async def write(self, key: BatchKey, items: Sequence[BatchLaunch]) -> list[BatchOutcome]:
        self.batches.append([str(i.body["script"]) for i in items])
        await asyncio.sleep(0)
        if self.batch_error is not None:
            raise self.batch_error
        out: list[BatchOutcome] = []
        for i in items:
            script = str(i.body["script"])
            if script.startswith("bad"):
                out.append(BadRequest(f"refused {script}", code="invalid_launch"))
            else:
                out.append(_accepted(script))
        return out

    async def write_alone(self, key: BatchKey, item: BatchLaunch) -> Accepted:
        self.alone.append(str(item.body["script"]))
        return _accepted(str(item.body["script"]))


def _accepted(script: str) -> Accepted:
    accepted: Any = {
        "instanceId": f"id-{script}",
        "state": "queued",
        "providerName": "kind",
        "launchedAt": "",
    }
    return accepted, {"script": script}


def _item(script: str) -> BatchLaunch:
    return BatchLaunch(body={"mode": "small", "script": script}, requester="alice")


async def test_a_batch_takes_launches_until_a_turn_of_the_loop_brings_none_or_it_is_full() -> None:
    w = _Writes()
    b = LaunchBatcher(write=w.write, alone=w.write_alone, max_batch=4)
    first = [asyncio.ensure_future(b.launch(KEY, _item(f"a{k}"))) for k in range(6)]
    await asyncio.sleep(0)  # the six reach the batcher in one turn: four fill the first batch
    # the next turn brings one more of the same key (it joins the open batch) and one of another
    later = asyncio.ensure_future(b.launch(KEY, _item("b0")))
    other = asyncio.ensure_future(b.launch(BatchKey(ns="team-b", provider="kind", mode="small"), _item("c0")))
    got = await asyncio.gather(*first, later, other)
    assert [g[0]["instanceId"] for g in got] == [f"id-a{k}" for k in range(6)] + ["id-b0", "id-c0"]
    assert sorted(w.batches) == sorted([["a0", "a1", "a2", "a3"], ["a4", "a5", "b0"], ["c0"]])
    # once written, a batch takes no more: the next launch is a batch of its own
    assert await b.launch(KEY, _item("d0")) == _accepted("d0")
    assert w.batches[-1] == ["d0"]
    assert (b.batches, b.launches, w.alone) == (4, 9, [])


async def test_each_launch_of_a_batch_gets_its_own_outcome() -> None:
    w = _Writes()
    b = LaunchBatcher(write=w.write, alone=w.write_alone)
    got = await asyncio.gather(*(b.launch(KEY, _item(s)) for s in ("a", "bad1", "c")), return_exceptions=True)
    assert got[0] == _accepted("a") and got[2] == _accepted("c")
    assert isinstance(got[1], BadRequest) and "bad1" in str(got[1])
    assert w.batches == [["a", "bad1", "c"]]


async def test_a_batch_that_fails_is_sent_again_launch_by_launch() -> None:
    w = _Writes(batch_error=RuntimeError("broken"))
    b = LaunchBatcher(write=w.write, alone=w.write_alone)
    got = await asyncio.gather(*(b.launch(KEY, _item(s)) for s in ("a", "b", "c")))
    assert got == [_accepted(s) for s in ("a", "b", "c")]
    assert sorted(w.alone) == ["a", "b", "c"]


@pytest.mark.parametrize(
    "error",
    [Unavailable(OUTCOME_UNKNOWN), NotFound("mode 'x' not found")],
    ids=["outcome-unknown", "catalog"],
)
async def test_an_error_of_the_whole_batch_is_every_launch_s_and_none_is_sent_again(
    error: ServiceError,
) -> None:
    """A database lost after the commit was sent leaves every launch of the batch unknown: none
    is written again (it may have been written), each is told."""
    w = _Writes(batch_error=error)
    b = LaunchBatcher(write=w.write, alone=w.write_alone)
    got = await asyncio.gather(*(b.launch(KEY, _item(s)) for s in ("a", "b")), return_exceptions=True)
    assert all(type(g) is type(error) and str(g) == str(error) for g in got)
    assert got[0] is not got[1]
    assert w.alone == []


async def test_a_launch_whose_caller_left_before_its_write_is_not_written() -> None:
    w = _Writes()
    b = LaunchBatcher(write=w.write, alone=w.write_alone)
    gone = asyncio.ensure_future(b.launch(KEY, _item("gone")))
    kept = asyncio.ensure_future(b.launch(KEY, _item("kept")))
    await asyncio.sleep(0)  # both are waiting in the open batch
    gone.cancel()
    assert await kept == _accepted("kept")
    assert w.batches == [["kept"]]


def test_a_batcher_needs_room_for_a_launch() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        LaunchBatcher(write=_Writes().write, alone=_Writes().write_alone, max_batch=0)


async def test_a_provider_that_dispatches_directly_sends_each_launch_of_a_batch_to_the_other_path() -> None:
    """The batch's catalog says "direct": each launch gets its own WrongPath, naming the path."""
    w = _Writes(batch_error=launches.WrongPath(direct=True))
    b = LaunchBatcher(write=w.write, alone=w.write_alone)
    got = await asyncio.gather(*(b.launch(KEY, _item(s)) for s in ("a", "b")), return_exceptions=True)
    assert all(isinstance(g, launches.WrongPath) and g.direct for g in got)
    assert got[0] is not got[1]
