"""Lease epochs (both backends): a completion from an earlier or expired lease is refused, a
state report from it is still accepted; and on PostgreSQL the secret store makes no key."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from nymph.queue.direct.settings import DirectSettings
from nymph.queue.sql.dialect import Conn
from tests.support.queue_helpers import FAST, Queue, add_kind, open_queue

LAUNCH = {"mode": "small", "script": "print(1)"}


async def _launch(q: Queue) -> str:
    r = await q.call("POST", "/v1/namespaces/default/providers/kind/launch", json_body=LAUNCH)
    assert r.status == 202, r.body
    return str(r.body["instanceId"])


async def _claim(q: Queue, lease: int) -> dict[str, object]:
    body = {"daemonId": "d1", "node": "n1", "capacity": 1, "wait": 2, "leaseSeconds": lease}
    r = await q.call("POST", "/v1/dispatch/claim", token="daemon", json_body=body)
    assert r.status == 200, r.body
    [task] = r.body["tasks"]
    return dict(task)


async def test_a_late_completion_from_an_earlier_lease_is_refused(kind: Queue) -> None:
    iid = await _launch(kind)
    first = await _claim(kind, lease=1)
    await asyncio.sleep(1.5)  # expired and swept back
    second = await _claim(kind, lease=60)
    assert second["taskId"] == first["taskId"] and second["attempt"] == first["attempt"] + 1  # type: ignore[operator]
    late = {"daemonId": "d1", "taskId": first["taskId"], "ok": True, "attempt": first["attempt"]}
    r = await kind.call("POST", "/v1/dispatch/complete", token="daemon", json_body=late)
    assert r.status == 409 and r.body["error"] == "lease_lost"
    # What the Pod did still counts: reports are not leases.
    report = {"seq": 1, "instanceId": iid, "state": "running", "node": "n1"}
    r = await kind.call(
        "POST",
        "/v1/dispatch/report",
        token="daemon",
        json_body={"daemonId": "d1", "stream": "s", "reports": [report]},
    )
    assert r.status == 200 and r.body["accepted"] == 1
    current = {**late, "attempt": second["attempt"]}
    r = await kind.call("POST", "/v1/dispatch/complete", token="daemon", json_body=current)
    assert r.status == 200 and r.body["status"] == "done"


async def test_a_completion_after_the_lease_expired_is_refused(kind: Queue) -> None:
    await _launch(kind)
    task = await _claim(kind, lease=60)

    def expire(conn: Conn) -> None:
        conn.execute("UPDATE tasks SET lease_expires = 1 WHERE task_id = ?", (task["taskId"],))

    await kind.store.db.write(expire)
    body = {"daemonId": "d1", "taskId": task["taskId"], "ok": True}
    r = await kind.call("POST", "/v1/dispatch/complete", token="daemon", json_body=body)
    assert r.status == 409 and r.body["error"] == "lease_lost"


async def test_on_postgresql_the_secret_store_makes_no_key_of_its_own(
    tmp_path: Path, queue_db: Path | str, backend: str
) -> None:
    if backend != "postgresql":
        return  # SQLite creates its key beside the file (tests/queue/test_secrets.py)
    settings = replace(FAST, direct=DirectSettings(secret_key_file=None))
    q, runner = await open_queue(tmp_path, settings, db=queue_db)
    # open_queue gives PostgreSQL a key file like a deployment; take it away again.
    from nymph.queue.direct.wiring import SECRETS
    from nymph.queue.secrets import KeySource, SecretBox

    q.app[SECRETS].box = SecretBox(source=KeySource(path=None, create=False))
    try:
        await add_kind(q)
        r = await q.call("PUT", "/v1/namespaces/default/secrets/kc", json_body={"value": "v4lue"})
        assert r.status >= 500 and "v4lue" not in r.text
        assert sorted(p.name for p in tmp_path.iterdir()) == ["secret-key"]  # no key of its own  # noqa: ASYNC240
    finally:
        await q.close()
        await runner.cleanup()
