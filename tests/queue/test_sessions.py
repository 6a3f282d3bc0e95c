"""Daemon sessions: each gap of the dispatch authorization, replayed as the
attack it allowed, now fails; and the client registers, and registers again, on its own."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, cast

import pytest

from nymph.client import DaemonIdentity, QueueAuthError, QueueConflict, QueueRegistrationRefused
from nymph.daemon.daemon import queue_client
from nymph.daemon.leases import LeaseLedger
from nymph.daemon.metrics import Metrics
from nymph.daemon.outbox import DropItem, Outbox
from nymph.daemon.sender import QueueSender
from nymph.daemon.settings import DaemonQueueSettings, DaemonSettings, KubeSettings
from nymph.queue.http.keys import SESSIONS
from nymph.queue.models import Principal, Role, SessionSettings
from nymph.queue.sessions import SessionStore
from tests.support.dispatch_helpers import take
from tests.support.queue_helpers import REGISTER, Queue, add_kind

NS = "/v1/namespaces"


async def _two_tenants(q: Queue) -> tuple[str, str]:
    """Providers in owner namespaces team-a (kube ns a-jobs) and team-b (kube ns b-jobs);
    one launch each. Returns (a's instance, b's instance)."""
    await add_kind(q, namespace="team-a", kube_ns="a-jobs")
    await add_kind(q, namespace="team-b", kube_ns="b-jobs")
    a = (await q.user("team-a").launch(provider="kind", mode="small", script="print(1)"))["instanceId"]
    b = (await q.user("team-b").launch(provider="kind", mode="small", script="print(1)"))["instanceId"]
    return a, b


async def test_renew_and_release_of_another_namespace_task_fail(queue: Queue) -> None:
    """Attack: a team-a daemon renewed a team-b task to 3600 s, then released it."""
    _, b = await _two_tenants(queue)
    victim = queue.daemon()
    [task] = await victim.claim(daemon_id="vb", node="n2", namespaces=["b-jobs"], capacity=5, wait=0)
    assert task["instanceId"] == b
    attacker = await queue.session("da", "n1", ("a-jobs",))
    for body in (
        {"taskIds": [task["taskId"]], "leaseSeconds": 3600},
        {"daemonId": "da", "taskIds": [task["taskId"]], "leaseSeconds": 3600},
    ):
        r = await queue.call("POST", "/v1/dispatch/renew", token=attacker, json_body=body)
        assert r.status == 200 and r.body == {"renewed": [], "lost": [task["taskId"]]}, r.body
        r = await queue.call("POST", "/v1/dispatch/release", token=attacker, json_body=body)
        assert r.status == 200 and r.body == {"released": []}
    # Naming the victim's daemon id does not help: the session is the identity.
    r = await queue.call(
        "POST",
        "/v1/dispatch/renew",
        token=attacker,
        json_body={"daemonId": "vb", "taskIds": [task["taskId"]]},
    )
    assert r.status == 403 and r.body["error"] == "wrong_daemon"
    # Even a session serving every namespace cannot touch a lease it does not hold.
    wide = await queue.session("wide", "n3")
    r = await queue.call("POST", "/v1/dispatch/release", token=wide, json_body={"taskIds": [task["taskId"]]})
    assert r.body == {"released": []}
    assert (await victim.renew(daemon_id="vb", task_ids=[task["taskId"]]))["renewed"] == [task["taskId"]]


async def test_complete_of_a_task_leased_to_another_daemon_fails(kind: Queue) -> None:
    """Attack: any daemon token completed a task leased to another daemon (self-declared id)."""
    await kind.user().launch(provider="kind", mode="small", script="print(1)")
    victim = kind.daemon()
    [task] = await victim.claim(daemon_id="victim", node="n1", capacity=1, wait=0)
    attacker = await kind.session("attacker", "n2")
    done = {"taskId": task["taskId"], "ok": True}
    r = await kind.call("POST", "/v1/dispatch/complete", token=attacker, json_body=done)
    assert r.status == 409 and r.body["error"] == "lease_lost"
    r = await kind.call(
        "POST", "/v1/dispatch/complete", token=attacker, json_body={**done, "daemonId": "victim"}
    )
    assert r.status == 403 and r.body["error"] == "wrong_daemon"
    # The bootstrap token alone can no longer do anything but register.
    r = await kind.call("POST", "/v1/dispatch/complete", token=kind.daemon_token, json_body=done)
    assert r.status == 401 and r.body["error"] == "session_required"
    assert (await victim.complete(daemon_id="victim", task_id=task["taskId"], ok=True))["status"] == "done"


async def test_stream_marks_are_per_daemon(kind: Queue) -> None:
    """Attack: another daemon set a victim's stream mark to 2^62; the victim's next report was dropped."""
    iid = (await kind.user().launch(provider="kind", mode="small", script="print(1)"))["instanceId"]
    attacker = await kind.session("attacker", "n2")
    r = await kind.call(
        "POST",
        "/v1/dispatch/report",
        token=attacker,
        json_body={
            "stream": "victim-1",
            "reports": [{"seq": 2**62, "instanceId": "lakeshore-00000000", "state": "running"}],
        },
    )
    assert r.status == 200 and r.body["lastSeq"] == 2**62
    victim = kind.daemon()
    assert await take(victim, daemon_id="victim", node="n1") == [iid]
    ack = await victim.report(
        daemon_id="victim",
        stream="victim-1",
        reports=[{"seq": 1, "instanceId": iid, "state": "running", "node": "n1"}],
    )
    assert ack == {"accepted": 1, "lastSeq": 1}
    assert (await kind.user().get_instance(provider="kind", instance_id=iid))["state"] == "running"


async def test_dispatch_is_confined_to_the_session_namespaces(queue: Queue) -> None:
    a, b = await _two_tenants(queue)
    session = await queue.session("da", "n1", ("a-jobs",))
    r = await queue.call(
        "POST",
        "/v1/dispatch/claim",
        token=session,
        json_body={"daemonId": "da", "node": "n1", "namespaces": ["b-jobs"], "capacity": 5, "wait": 0},
    )
    assert r.status == 403 and r.body["error"] == "wrong_namespace"
    r = await queue.call("POST", "/v1/dispatch/claim", token=session, json_body={"capacity": 5, "wait": 0})
    assert r.status == 200 and [t["instanceId"] for t in r.body["tasks"]] == [a]
    r = await queue.call(
        "POST",
        "/v1/dispatch/report",
        token=session,
        json_body={"stream": "s", "reports": [{"seq": 1, "instanceId": b, "state": "running", "node": "n1"}]},
    )
    assert r.status == 200
    assert (await queue.user("team-b").get_instance(provider="kind", instance_id=b))["state"] == "queued"
    r = await queue.call("POST", "/v1/dispatch/logs", token=session, json_body={"instanceId": b, "logs": "x"})
    assert r.status == 404
    # active: only the session's own node, only its namespaces
    r = await queue.call("GET", "/v1/dispatch/active?node=n2", token=session)
    assert r.status == 403 and r.body["error"] == "wrong_node"
    r = await queue.call(
        "POST", "/v1/dispatch/claim", token=session, json_body={"node": "n2", "capacity": 0, "wait": 0}
    )
    assert r.status == 403 and r.body["error"] == "wrong_node"


async def test_daemons_are_listed_only_to_tokens_that_may_see_them(queue: Queue) -> None:
    await queue.daemon().claim(daemon_id="da", node="n1", namespaces=["team-a", "x"], capacity=0, wait=0)
    await queue.daemon().claim(daemon_id="db", node="n2", namespaces=["team-b"], capacity=0, wait=0)
    everyone = await queue.user().list_daemons()
    assert {d["daemonId"] for d in everyone} == {"da", "db"}
    team_a = queue.client(await queue.token(Role.USER, namespace="team-a"), namespace="team-a")
    [seen] = await team_a.list_daemons()
    assert seen["daemonId"] == "da" and seen["namespaces"] == ["team-a"]
    team_c = queue.client(await queue.token(Role.USER, namespace="team-c"), namespace="team-c")
    assert await team_c.list_daemons() == []


async def test_daemon_credentials_cannot_read_user_routes(kind: Queue) -> None:
    iid = (await kind.user().launch(provider="kind", mode="small", script="print('secret')"))["instanceId"]
    session = await kind.session("d1", "n1")
    for token in ("daemon", session):
        for path in (
            "/default/providers",
            "/default/providers/kind",
            "/default/modes/small",
            f"/default/providers/kind/instances/{iid}",
            f"/default/providers/kind/instances/{iid}/logs",
            "/default/daemons",
        ):
            r = await kind.call("GET", NS + path, token=token)
            assert r.status == 403 and r.body["error"] == "wrong_role", (token, path, r.status)


async def test_register_rules(queue: Queue) -> None:
    r = await queue.call("POST", REGISTER, token="user", json_body={"daemonId": "d1"})
    assert r.status == 403 and r.body["error"] == "wrong_role"
    session = await queue.session("d1", "n1")
    r = await queue.call("POST", REGISTER, token=session, json_body={"daemonId": "d2"})
    assert r.status == 403 and r.body["error"] == "wrong_role"
    r = await queue.call("POST", REGISTER, token="daemon", json_body={"daemonId": "d1", "node": "n2"})
    assert r.status == 409 and r.body["error"] == "daemon_id_in_use"
    r = await queue.call(
        "POST", REGISTER, token="daemon", json_body={"daemonId": "d1", "namespaces": ["Bad_NS"]}
    )
    assert r.status == 422
    # The same daemon id on the same node (a restart) replaces the session; the old one is gone.
    r = await queue.call("POST", REGISTER, token="daemon", json_body={"daemonId": "d1", "node": "n1"})
    assert r.status == 201 and r.body["sessionToken"] != session
    r = await queue.call("POST", "/v1/dispatch/claim", token=session, json_body={"capacity": 0, "wait": 0})
    assert r.status == 401 and r.body["error"] == "unknown_session"
    # Only the hash is kept.
    assert r.body["detail"] and session not in r.text
    raw = await queue.raw_state()
    assert session.encode() not in raw


async def test_client_registers_again_when_the_queue_forgot_or_lapsed(kind: Queue) -> None:
    await kind.user().launch(provider="kind", mode="small", script="print(1)")
    client = kind.client("daemon")
    client.daemon = DaemonIdentity(daemon_id="d1", node="n1", namespaces=("jobs",))
    assert await client.active(node="n1") == []
    first = client._session_token
    store = kind.app[SESSIONS]
    await kind.store.db.write(lambda c: c.execute("DELETE FROM daemon_sessions"))  # forgotten
    store.forget_cached()
    [task] = await client.claim(daemon_id="d1", node="n1", namespaces=["jobs"], capacity=1, wait=0)
    assert client._session_token not in (None, first)
    await kind.store.db.write(lambda c: c.execute("UPDATE daemon_sessions SET expires_at = 0"))  # lapsed
    store.forget_cached()
    assert (await client.complete(daemon_id="d1", task_id=task["taskId"], ok=True))["status"] == "done"
    # A bootstrap token the queue does not know is still an error, not a loop.
    stranger = kind.client("nyq_not-a-real-token-0123456789")
    with pytest.raises(QueueAuthError):
        await stranger.claim(daemon_id="d9", node="n9", capacity=1, wait=0)


async def test_two_daemons_cannot_share_an_id_across_nodes(kind: Queue) -> None:
    one, two = kind.daemon(), kind.daemon()
    await one.claim(daemon_id="same", node="n1", capacity=0, wait=0)
    with pytest.raises(QueueConflict) as err:
        await two.claim(daemon_id="same", node="n2", capacity=0, wait=0)
    assert err.value.code == "daemon_id_in_use"


async def test_a_replaced_daemon_reports_before_its_first_claim(kind: Queue) -> None:
    """A daemon Pod replaced on its node keeps its id (node name and pid 1), and its first call
    is often a report replayed from its outbox while the old session is still live. It must
    register as its whole identity: registered as node "" it was refused (409), and the sender
    dropped the report, leaving the instance ``running`` after its Pod finished."""
    iid = (await kind.user().launch(provider="kind", mode="small", script="print(1)"))["instanceId"]
    old = kind.daemon()
    [task] = await old.claim(daemon_id="node1-1", node="node1", namespaces=["jobs"], capacity=1, wait=0)
    assert task["instanceId"] == iid
    settings = DaemonSettings(
        daemon_id="node1-1",
        node="node1",
        queue=DaemonQueueSettings(url=kind.url, token=kind.daemon_token),
        kube=KubeSettings(namespaces=("jobs",)),
    )
    async with queue_client(settings) as new:
        report = {"seq": 1, "instanceId": iid, "state": "stopped", "reason": "Completed", "node": "node1"}
        ack = await new.report(daemon_id="node1-1", stream="s1", reports=[report])
        assert ack["accepted"] == 1
    inst = await kind.user().get_instance(provider="kind", instance_id=iid)
    assert (inst["state"], inst["reason"]) == ("stopped", "Completed")


async def test_a_refused_registration_keeps_the_report_for_a_retry(kind: Queue, tmp_path: Path) -> None:
    """A registration refused (the id is live on another node) says nothing about the report:
    the outbox keeps it instead of dropping it as refused."""
    iid = (await kind.user().launch(provider="kind", mode="small", script="print(1)"))["instanceId"]
    await kind.daemon().claim(daemon_id="dup", node="elsewhere", capacity=0, wait=0)
    settings = DaemonSettings(
        daemon_id="dup",
        node="node1",
        queue=DaemonQueueSettings(url=kind.url, token=kind.daemon_token),
        kube=KubeSettings(namespaces=("jobs",)),
    )
    outbox = Outbox(tmp_path)
    outbox.report(instance_id=iid, state="running")
    async with queue_client(settings) as client:
        sender = QueueSender(
            daemon_id="dup", client=client, leases=cast(LeaseLedger, None), outbox=outbox, metrics=Metrics()
        )
        kind_, batch = outbox._next_batch()
        with pytest.raises(QueueRegistrationRefused) as err:
            await sender(kind_, batch)
    assert err.value.code == "daemon_id_in_use"
    assert not isinstance(err.value, DropItem) and outbox.pending == 1


async def test_replacing_a_live_session_hands_its_leases_back_not_over(kind: Queue) -> None:
    """Registering a live daemon id again (a restart, or a holder of the bootstrap token posing as
    it) is allowed, but the new session gets none of the old one's leases: they go back to the
    queue at once, and cost no attempt."""
    iid = (await kind.user().launch(provider="kind", mode="small", script="print(1)"))["instanceId"]
    victim = await kind.session("d1", "n1")
    r = await kind.call("POST", "/v1/dispatch/claim", token=victim, json_body={"capacity": 1, "wait": 0})
    [task] = r.body["tasks"]
    tid = task["taskId"]
    r = await kind.call("POST", REGISTER, token="daemon", json_body={"daemonId": "d1", "node": "n1"})
    assert r.status == 201
    usurper = r.body["sessionToken"]
    for route, body in (
        ("complete", {"taskId": tid, "ok": True}),
        ("renew", {"taskIds": [tid]}),
        ("release", {"taskIds": [tid]}),
    ):
        r = await kind.call("POST", f"/v1/dispatch/{route}", token=usurper, json_body=body)
        assert r.status in (200, 409), (route, r.status, r.body)
        assert r.status == 409 or tid not in r.body.get("renewed", []) + r.body.get("released", [])
    # The replaced session is gone; the task waits for any daemon, its attempt not spent.
    r = await kind.call("POST", "/v1/dispatch/renew", token=victim, json_body={"taskIds": [tid]})
    assert r.status == 401 and r.body["error"] == "unknown_session"
    status = await kind.user().get_task(task_id=tid)
    assert status["status"] == "pending" and status["attempts"] == 0
    r = await kind.call("POST", "/v1/dispatch/claim", token=usurper, json_body={"capacity": 1, "wait": 0})
    assert [t["instanceId"] for t in r.body["tasks"]] == [iid]  # claimed anew, as any daemon may


async def test_a_live_session_registered_with_another_scope_is_not_replaced(queue: Queue) -> None:
    await _two_tenants(queue)
    b_token = await queue.token(Role.DAEMON, namespace="team-b")
    a_token = await queue.token(Role.DAEMON, namespace="team-a")
    await queue.session("vb", "n1", ("b-jobs",), token=b_token)
    r = await queue.call(
        "POST", REGISTER, token=a_token, json_body={"daemonId": "vb", "node": "n1", "namespaces": ["b-jobs"]}
    )
    assert r.status == 409 and r.body["error"] == "daemon_id_in_use"
    # The same scope (a restarted daemon with the DaemonSet's token) gets back in.
    r = await queue.call(
        "POST", REGISTER, token=b_token, json_body={"daemonId": "vb", "node": "n1", "namespaces": ["b-jobs"]}
    )
    assert r.status == 201


async def test_a_client_acting_as_two_daemons_keeps_both_sessions(kind: Queue) -> None:
    await kind.user().launch(provider="kind", mode="small", script="print(1)")
    d = kind.daemon()
    [task] = await d.claim(daemon_id="d1", node="n1", capacity=1, wait=0)
    with pytest.raises(QueueConflict):
        await d.complete(daemon_id="d2", task_id=task["taskId"], ok=True)
    # Back to d1: its session is reused, not registered again (which would hand its lease back).
    assert (await d.complete(daemon_id="d1", task_id=task["taskId"], ok=True))["status"] == "done"


async def _expiries(q: Queue) -> dict[str, float]:
    rows = await q.store.db.read(
        lambda conn: conn.execute("SELECT daemon_id, expires_at FROM daemon_sessions").fetchall()
    )
    return {str(r[0]): float(r[1]) for r in rows}


async def _sessions_half_way(q: Queue, n: int) -> tuple[SessionStore, dict[str, str], float]:
    """A session store of its own on ``q``'s database (no replica's loop flushes it), ``n``
    sessions registered with it and each half-way through its ttl (an extension is due)."""
    settings = SessionSettings()
    store = SessionStore(settings=settings, db=q.store.db)
    bootstrap = Principal(token_id="tok-bootstrap", role=Role.DAEMON, name="daemon bootstrap")
    creds = {}
    for k in range(n):
        reg = await store.register(bootstrap=bootstrap, daemon_id=f"d{k}", node=f"n{k}", namespaces=())
        creds[f"d{k}"] = reg.credential
    half = time.time() + settings.ttl_seconds / 2
    await q.store.db.write(lambda c: c.execute("UPDATE daemon_sessions SET expires_at = ?", (half,)))
    store.forget_cached()
    return store, creds, half


async def test_calls_extend_their_sessions_in_one_batch_written_later(queue: Queue) -> None:
    """A call made once a tenth of its session's ttl has passed extends the session, but the new
    expiry is written with every other one due by the replica's next flush (a thousand daemons
    would otherwise each cost a write transaction); until then the session is as live as
    before, and the flush writes each expiry once."""
    store, creds, half = await _sessions_half_way(queue, 3)
    for cred in creds.values():
        session, lapsed = await store.authenticate(cred)
        assert session is not None and not lapsed
    assert await _expiries(queue) == dict.fromkeys(creds, half), "an extension was written per call"
    started = time.time()
    assert await store.flush_extended() == 3
    after = await _expiries(queue)
    ttl = SessionSettings().ttl_seconds
    assert set(after) == set(creds) and all(
        started + ttl * 0.99 < at <= time.time() + ttl for at in after.values()
    )
    assert await store.flush_extended() == 0  # nothing left due


async def test_a_session_extended_here_stays_live_until_written_and_a_failed_flush_is_kept(
    queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An extension not written yet counts: a session whose stored expiry has passed since is
    still accepted. A flush that fails keeps its batch for the next one, and a session removed
    meanwhile is not brought back by it."""
    store, creds, _ = await _sessions_half_way(queue, 2)
    for cred in creds.values():
        assert (await store.authenticate(cred))[0] is not None
    await queue.store.db.write(lambda c: c.execute("UPDATE daemon_sessions SET expires_at = 1"))
    store.forget_cached()
    session, lapsed = await store.authenticate(creds["d0"])
    assert session is not None and session.daemon_id == "d0" and not lapsed
    db = queue.store.db
    real_write = db.write

    async def failing(fn: Any) -> Any:
        raise RuntimeError("the database is away")

    monkeypatch.setattr(db, "write", failing)
    with pytest.raises(RuntimeError):
        await store.flush_extended()
    monkeypatch.setattr(db, "write", real_write)
    await db.write(lambda c: c.execute("DELETE FROM daemon_sessions WHERE daemon_id = 'd1'"))
    assert await store.flush_extended() == 2
    after = await _expiries(queue)
    assert list(after) == ["d0"] and after["d0"] > time.time() + SessionSettings().ttl_seconds / 2
