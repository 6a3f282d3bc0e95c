"""Only an instance's own daemon writes it: its state reports, log chunks, log tail and result
files come from the session holding the lease of one of its tasks, or from the daemon that
applied it (for a Pod, a daemon on the node it was applied on; for a dockyard instance, the
daemon id that applied it). Anything else is a 403 ``not_instance_daemon`` and nothing is
written. Over real HTTP on both backends."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from nymph.client import QueueNotInstanceDaemon
from nymph.daemon.daemon import queue_client
from nymph.daemon.leases import LeaseLedger
from nymph.daemon.metrics import Metrics
from nymph.daemon.outbox import DropItem, Outbox
from nymph.daemon.sender import QueueSender
from nymph.daemon.settings import DaemonQueueSettings, DaemonSettings, KubeSettings
from tests.support.dispatch_helpers import apply, take
from tests.support.queue_helpers import Queue

NS = "/v1/namespaces/default"
FORGED = "FORGED LOG LINE\n"
EXAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "examples"


def _example(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text())
    return data


def _b64(data: bytes | str) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode("ascii")


async def _launch(q: Queue) -> str:
    return str((await q.user().launch(provider="kind", mode="small", script="print(1)"))["instanceId"])


async def _written(q: Queue, iid: str) -> dict[str, Any]:
    """Everything a daemon's writes can change on the instance, read from the database."""

    def read(conn: Any) -> dict[str, Any]:
        inst = conn.execute(
            "SELECT state, reason, message, node, version, exit_code, results_error FROM instances "
            "WHERE instance_id = ?",
            (iid,),
        ).fetchone()
        chunks = [
            bytes(r[0]) for r in conn.execute("SELECT data FROM log_chunks WHERE instance_id = ?", (iid,))
        ]
        stream = conn.execute(
            "SELECT total, complete FROM log_streams WHERE instance_id = ?", (iid,)
        ).fetchone()
        tail = conn.execute("SELECT text FROM instance_logs WHERE instance_id = ?", (iid,)).fetchone()
        files = [r[0] for r in conn.execute("SELECT path FROM result_files WHERE instance_id = ?", (iid,))]
        events = conn.execute("SELECT COUNT(*) FROM instance_events WHERE instance_id = ?", (iid,)).fetchone()
        return {
            "instance": tuple(inst),
            "chunks": chunks,
            "stream": None if stream is None else tuple(stream),
            "tail": None if tail is None else tail[0],
            "files": files,
            "events": int(events[0]),
        }

    return await q.store.db.read(read)


async def _forge_everything(q: Queue, token: str, iid: str, *, offset: int) -> list[tuple[str, int, Any]]:
    """A final report, log chunks, a log tail, a result file and a results error for ``iid``
    sent with ``token``; returns (what, status, error code) of each answer."""
    final = {
        "seq": 1,
        "instanceId": iid,
        "state": "stopped",
        "reason": "Completed",
        "exitCode": 0,
        "node": "n-forged",
    }
    calls: list[tuple[str, str, dict[str, Any]]] = [
        ("report", "report", {"stream": "forged", "reports": [final]}),
        ("log chunk", "logchunks", {"instanceId": iid, "offset": offset, "data": _b64(FORGED)}),
        ("log from 0", "logchunks", {"instanceId": iid, "offset": 0, "data": _b64(FORGED), "final": True}),
        ("log tail", "logs", {"instanceId": iid, "logs": FORGED}),
        ("result file", "results", {"instanceId": iid, "path": "out.txt", "data": _b64("x"), "eof": True}),
        ("results error", "results", {"instanceId": iid, "error": "forged"}),
    ]
    out = []
    for what, route, body in calls:
        r = await q.call("POST", f"/v1/dispatch/{route}", token=token, json_body=body)
        out.append((what, r.status, (r.body or {}).get("error")))
    return out


async def _own_daemon_runs(kind: Queue) -> tuple[str, Any]:
    """A launch claimed and applied by d1 on n1, reported running, with a line of log."""
    iid = await _launch(kind)
    d = kind.daemon()
    assert await apply(d, daemon_id="d1", node="n1") == [iid]
    running = {"seq": 1, "instanceId": iid, "state": "running", "node": "n1"}
    assert (await d.report(daemon_id="d1", stream="d1", reports=[running]))["accepted"] == 1
    await d.ship_log_chunk(daemon_id="d1", instance_id=iid, offset=0, data=b"real line\n")
    return iid, d


async def test_another_daemon_cannot_write_an_instance_it_does_not_run(kind: Queue) -> None:
    """A daemon serving the same namespace on another node, and one registered for every
    namespace, have a forged final report (which would also move the node), log chunks, a log
    tail and result files refused with 403; the instance's state, node, logs and results stay as
    its daemon left them, and its daemon is still heard."""
    iid, d = await _own_daemon_runs(kind)
    before = await _written(kind, iid)
    for forger in (await kind.session("d2", "n2", ("jobs",)), await kind.session("d-all", "n3")):
        answers = await _forge_everything(kind, forger, iid, offset=len(b"real line\n"))
        assert all(status == 403 and code == "not_instance_daemon" for _, status, code in answers), answers
    assert await _written(kind, iid) == before
    user = kind.user()
    assert (await user.get_logs(provider="kind", instance_id=iid)) == "real line\n"
    assert (await kind.call("GET", f"{NS}/providers/kind/instances/{iid}/results")).body["items"] == []
    # Its own daemon writes as before.
    ended = {"seq": 2, "instanceId": iid, "state": "stopped", "reason": "Completed", "exitCode": 0}
    assert (await d.report(daemon_id="d1", stream="d1", reports=[ended]))["accepted"] == 1
    await d.upload_result(daemon_id="d1", instance_id=iid, path="out.txt", data=b"ok", eof=True)
    inst = await user.get_instance(provider="kind", instance_id=iid)
    assert (inst["state"], inst.get("exitCode"), inst["node"]) == ("stopped", 0, "n1")


async def test_one_forged_report_refuses_its_whole_batch(kind: Queue) -> None:
    """A batch with a report on another daemon's instance is refused whole: its report on its
    own instance is not applied either, and the stream's mark stays, so the batch sent again
    without the forged report is applied."""
    victim, _ = await _own_daemon_runs(kind)
    mine = await _launch(kind)
    d2 = kind.daemon()
    assert await take(d2, daemon_id="d2", node="n2") == [mine]
    own = {"seq": 1, "instanceId": mine, "state": "running", "node": "n2"}
    forged = {"seq": 2, "instanceId": victim, "state": "stopped", "reason": "Completed"}
    with pytest.raises(QueueNotInstanceDaemon):
        await d2.report(daemon_id="d2", stream="d2", reports=[own, forged])
    assert (await kind.user().get_instance(provider="kind", instance_id=mine))["state"] == "queued"
    assert (await kind.user().get_instance(provider="kind", instance_id=victim))["state"] == "running"
    assert await d2.report(daemon_id="d2", stream="d2", reports=[own]) == {"accepted": 1, "lastSeq": 1}
    assert (await kind.user().get_instance(provider="kind", instance_id=mine))["state"] == "running"


async def test_a_daemon_never_writes_an_instance_nobody_applied(kind: Queue) -> None:
    """A queued launch no daemon has claimed is nobody's to write yet."""
    iid = await _launch(kind)
    before = await _written(kind, iid)
    answers = await _forge_everything(kind, await kind.session("d1", "n1", ("jobs",)), iid, offset=0)
    assert all(status == 403 and code == "not_instance_daemon" for _, status, code in answers), answers
    assert await _written(kind, iid) == before


async def test_a_replaced_daemon_replays_its_reports(kind: Queue) -> None:
    """A daemon restarted on its node (the same id registers again and replaces its session)
    replays its outbox first: the report on the Pod it applied is taken, and so is one on the
    launch whose lease the replacement handed back, until another daemon claims it."""
    applied = await _launch(kind)
    d = kind.daemon()
    assert await apply(d, daemon_id="node1-1", node="node1") == [applied]
    held = await _launch(kind)
    assert await take(d, daemon_id="node1-1", node="node1") == [held]
    restarted = await kind.session("node1-1", "node1", ("jobs",))  # replaces the live session
    replayed = [
        {"seq": 1, "instanceId": applied, "state": "stopped", "reason": "Completed", "exitCode": 0},
        {"seq": 2, "instanceId": held, "state": "running", "node": "node1"},
    ]
    r = await kind.call(
        "POST", "/v1/dispatch/report", token=restarted, json_body={"stream": "s", "reports": replayed}
    )
    assert r.status == 200 and r.body == {"accepted": 2, "lastSeq": 2}
    chunk = {"instanceId": held, "offset": 0, "data": _b64("hi\n")}
    assert (await kind.call("POST", "/v1/dispatch/logchunks", token=restarted, json_body=chunk)).status == 200
    user = kind.user()
    assert (await user.get_instance(provider="kind", instance_id=applied))["state"] == "stopped"
    assert (await user.get_instance(provider="kind", instance_id=held))["state"] == "running"
    # Another daemon claims the handed-back launch: it is the new holder's from then on.
    other = kind.daemon()
    assert await take(other, daemon_id="d2", node="n2") == [held]
    late = {"stream": "s", "reports": [{"seq": 3, "instanceId": held, "state": "stopped"}]}
    r = await kind.call("POST", "/v1/dispatch/report", token=restarted, json_body=late)
    assert r.status == 403 and r.body["error"] == "not_instance_daemon"


async def test_a_daemon_restarted_with_a_new_id_on_the_node_adopts_its_pods(kind: Queue) -> None:
    """A Pod is pinned to the node it was applied on, and the daemon of that node follows it:
    one restarted there under a new id (a new process id in its default id) reconciles with
    ``active`` and reports the Pods it adopts; a daemon of another node does not."""
    iid = await _launch(kind)
    assert await apply(kind.daemon(), daemon_id="n1-100", node="n1") == [iid]
    successor = kind.daemon()
    await successor.claim(daemon_id="n1-200", node="n1", namespaces=["jobs"], capacity=0, wait=0)
    assert [i["instanceId"] for i in await successor.active(node="n1")] == [iid]
    gone = {"seq": 1, "instanceId": iid, "state": "stopped", "reason": "Deleted", "message": "no Pod found"}
    assert (await successor.report(daemon_id="n1-200", stream="n1-200", reports=[gone]))["accepted"] == 1
    assert (await kind.user().get_instance(provider="kind", instance_id=iid))["reason"] == "Deleted"
    elsewhere = await kind.session("n2-1", "n2")
    r = await kind.call("GET", "/v1/dispatch/active?node=n2", token=elsewhere)
    assert r.status == 200 and r.body["items"] == []


async def test_a_launch_claimed_on_a_node_is_written_by_that_nodes_restarted_daemon(kind: Queue) -> None:
    """A daemon killed after applying a Pod and before completing its launch: the one restarted
    on that node under a new id adopts the Pod and reports it (the launch's lease is still its
    predecessor's); a daemon of another node may not."""
    iid = await _launch(kind)
    assert await take(kind.daemon(), daemon_id="n1-100", node="n1") == [iid]
    successor = await kind.session("n1-200", "n1", ("jobs",))
    running = {
        "stream": "n1-200",
        "reports": [{"seq": 1, "instanceId": iid, "state": "running", "node": "n1"}],
    }
    r = await kind.call("POST", "/v1/dispatch/report", token=successor, json_body=running)
    assert r.status == 200 and r.body["accepted"] == 1
    elsewhere = await kind.session("n2-1", "n2", ("jobs",))
    r = await kind.call("POST", "/v1/dispatch/report", token=elsewhere, json_body=running)
    assert r.status == 403 and r.body["error"] == "not_instance_daemon"
    assert (await kind.user().get_instance(provider="kind", instance_id=iid))["state"] == "running"


async def test_an_instance_that_ended_before_its_launch_completed_keeps_its_daemon(kind: Queue) -> None:
    """A Pod that ran and ended while its launch's completion was lost: once the queue settles
    the launch (done, without a lease), the daemon of its node still sends the last of its log
    and its result files."""
    iid = await _launch(kind)
    d = kind.daemon()
    [task] = await d.claim(
        daemon_id="d1", node="n1", namespaces=["jobs"], capacity=1, wait=0, lease_seconds=1
    )
    assert task["instanceId"] == iid
    ended = {"seq": 1, "instanceId": iid, "state": "stopped", "reason": "Completed", "exitCode": 0}
    assert (await d.report(daemon_id="d1", stream="d1", reports=[ended]))["accepted"] == 1
    await asyncio.sleep(1.3)  # its completion never comes; the lease lapses
    await kind.daemon().claim(daemon_id="d9", node="n9", capacity=1, wait=0)  # settles the launch
    [row] = await kind.store.db.read(
        lambda c: c.execute("SELECT status, lease_owner FROM tasks WHERE instance_id = ?", (iid,)).fetchall()
    )
    assert tuple(row) == ("done", None)
    await d.ship_log_chunk(daemon_id="d1", instance_id=iid, offset=0, data=b"last words\n", final=True)
    restarted = kind.daemon()
    await restarted.claim(daemon_id="d1-new", node="n1", capacity=0, wait=0)
    await restarted.upload_result(daemon_id="d1-new", instance_id=iid, path="out.txt", data=b"ok", eof=True)
    assert await kind.user().get_logs(provider="kind", instance_id=iid) == "last words\n"
    listed = await kind.call("GET", f"{NS}/providers/kind/instances/{iid}/results")
    assert listed.body["items"] == [{"path": "out.txt", "size": 2}]


async def test_a_stop_taken_by_another_node_is_written_by_its_taker_while_it_holds_it(kind: Queue) -> None:
    """A stop waits for the instance's node, then any daemon of its namespaces may take it
    (stop_node_fallback): while it holds that lease it reports and ships logs for the instance;
    once the stop is done it writes no more. The daemon that applied the Pod still does (its
    last log, its result files)."""
    iid, d1 = await _own_daemon_runs(kind)
    await kind.user().stop(provider="kind", instance_id=iid)
    taker = kind.daemon()
    await asyncio.sleep(kind.store.settings.lease.stop_node_fallback + 0.2)
    [stop] = await taker.claim(daemon_id="d2", node="n2", namespaces=["jobs"], capacity=1, wait=0)
    assert (stop["kind"], stop["instanceId"]) == ("stop", iid)
    stopping = {"seq": 1, "instanceId": iid, "state": "stopping", "reason": "Stopped"}
    assert (await taker.report(daemon_id="d2", stream="d2", reports=[stopping]))["accepted"] == 1
    await taker.ship_log_chunk(daemon_id="d2", instance_id=iid, offset=len(b"real line\n"), data=b"bye\n")
    await taker.complete(daemon_id="d2", task_id=stop["taskId"], ok=True)
    with pytest.raises(QueueNotInstanceDaemon):
        await taker.ship_log_chunk(daemon_id="d2", instance_id=iid, offset=14, data=b"more\n")
    await d1.ship_log_chunk(daemon_id="d1", instance_id=iid, offset=14, data=b"", final=True)
    await d1.upload_result(daemon_id="d1", instance_id=iid, path="out.txt", data=b"ok", eof=True)
    assert await kind.user().get_logs(provider="kind", instance_id=iid) == "real line\nbye\n"
    inst = await kind.user().get_instance(provider="kind", instance_id=iid)
    assert (inst["state"], inst["reason"]) == ("stopped", "Stopped")


async def test_an_expired_lease_claimed_again_belongs_to_its_new_holder(kind: Queue) -> None:
    """A launch whose lease expired is claimed by another daemon: the new holder writes it, the
    old one no longer does."""
    iid = await _launch(kind)
    old = kind.daemon()
    [task] = await old.claim(
        daemon_id="d1", node="n1", namespaces=["jobs"], capacity=1, wait=0, lease_seconds=1
    )
    assert task["instanceId"] == iid
    await asyncio.sleep(1.3)
    new = kind.daemon()
    assert await take(new, daemon_id="d2", node="n2") == [iid]
    starting = {"seq": 1, "instanceId": iid, "state": "starting", "node": "n2"}
    assert (await new.report(daemon_id="d2", stream="d2", reports=[starting]))["accepted"] == 1
    with pytest.raises(QueueNotInstanceDaemon):
        await old.report(
            daemon_id="d1", stream="d1", reports=[{**starting, "node": "n1", "state": "running"}]
        )
    inst = await kind.user().get_instance(provider="kind", instance_id=iid)
    assert (inst["state"], inst["node"]) == ("starting", "n2")


async def test_a_dockyard_instance_is_bound_to_the_daemon_id_that_applied_it(kind: Queue) -> None:
    """A dockyard instance has no node: the daemon id that applied it writes it (a replaced
    session of it too), another daemon on the same node does not."""
    queue = kind
    body = {
        name: _example(f"dockyard-grpo-vllm{suffix}.yaml")
        for name, suffix in (("recipe", ""), ("infra", ".infra"))
    }
    r = await queue.call("POST", f"{NS}/providers/kind/dockyard", json_body=body)
    assert r.status == 202, r.body
    iid = r.body["instanceId"]
    d = queue.daemon()
    assert await apply(d, daemon_id="dy-1", node="n1") == [iid]
    inst = await queue.user().get_instance(provider="kind", instance_id=iid)
    assert inst["node"] is None
    neighbour = await queue.session("dy-2", "n1", ("jobs",))
    running = {"seq": 1, "instanceId": iid, "state": "running"}
    r = await queue.call(
        "POST", "/v1/dispatch/report", token=neighbour, json_body={"stream": "x", "reports": [running]}
    )
    assert r.status == 403 and r.body["error"] == "not_instance_daemon"
    replaced = await queue.session("dy-1", "n1", ("jobs",))
    r = await queue.call(
        "POST", "/v1/dispatch/report", token=replaced, json_body={"stream": "x", "reports": [running]}
    )
    assert r.status == 200 and r.body["accepted"] == 1
    assert (await queue.user().get_instance(provider="kind", instance_id=iid))["state"] == "running"


async def test_the_daemon_drops_what_is_refused_as_not_its_own_and_sends_the_rest(
    kind: Queue, tmp_path: Path
) -> None:
    """The daemon's sender: a batch refused for one report on another daemon's instance is
    sent again report by report, so only that one is dropped (never retried); a refused log
    chunk is dropped (DropItem), not retried forever."""
    victim, _ = await _own_daemon_runs(kind)
    mine = await _launch(kind)
    settings = DaemonSettings(
        daemon_id="d2",
        node="n2",
        queue=DaemonQueueSettings(url=kind.url, token=kind.daemon_token),
        kube=KubeSettings(namespaces=("jobs",)),
    )
    outbox = Outbox(tmp_path)
    async with queue_client(settings) as client:
        [task] = await client.claim(daemon_id="d2", node="n2", namespaces=["jobs"], capacity=1, wait=0)
        assert task["instanceId"] == mine
        outbox.report(instance_id=mine, state="starting", node="n2")
        outbox.report(instance_id=victim, state="stopped", reason="Completed")
        outbox.report(instance_id=mine, state="running", node="n2")
        sender = QueueSender(
            daemon_id="d2", client=client, leases=cast(LeaseLedger, None), outbox=outbox, metrics=Metrics()
        )
        kind_, batch = outbox._next_batch()
        assert (kind_, len(batch)) == ("report", 3)
        await sender(kind_, batch)  # no error: the outbox acknowledges the batch
        outbox.log_chunk(instance_id=victim, offset=0, data=FORGED.encode())
        with pytest.raises(DropItem):
            await sender(*_last(outbox))
    user = kind.user()
    assert (await user.get_instance(provider="kind", instance_id=mine))["state"] == "running"
    assert (await user.get_instance(provider="kind", instance_id=victim))["state"] == "running"
    assert await user.get_logs(provider="kind", instance_id=victim) == "real line\n"


def _last(outbox: Outbox) -> tuple[str, list[dict[str, Any]]]:
    item = outbox.mem[-1]
    return str(item["kind"]), [item]
