"""Bearer tokens: 401 and 403, role and namespace scope, and tokens never leaking."""

from __future__ import annotations

import logging

import pytest
import structlog

from nymph.client import QueueAuthError
from nymph.queue.models import Role
from tests.support.queue_helpers import Queue, add_kind

NS = "/v1/namespaces/default"
LAUNCH = {"mode": "small", "script": "print(1)"}
USER_ROUTES = [
    ("GET", NS + "/providers"),
    ("POST", NS + "/providers"),
    ("GET", NS + "/providers/kind"),
    ("PUT", NS + "/providers/kind"),
    ("DELETE", NS + "/providers/kind"),
    ("GET", NS + "/modes"),
    ("POST", NS + "/modes"),
    ("GET", NS + "/modes/small"),
    ("PUT", NS + "/modes/small"),
    ("DELETE", NS + "/modes/small"),
    ("POST", NS + "/providers/kind/launch"),
    ("GET", NS + "/providers/kind/instances"),
    ("GET", NS + "/providers/kind/instances/lakeshore-00000000"),
    ("DELETE", NS + "/providers/kind/instances/lakeshore-00000000"),
    ("GET", NS + "/providers/kind/instances/lakeshore-00000000/logs"),
    ("POST", NS + "/providers/kind/test"),
    ("GET", NS + "/tasks/task-0"),
    ("GET", NS + "/daemons"),
]
DISPATCH_ROUTES = [
    ("POST", "/v1/dispatch/claim"),
    ("POST", "/v1/dispatch/renew"),
    ("POST", "/v1/dispatch/release"),
    ("POST", "/v1/dispatch/complete"),
    ("POST", "/v1/dispatch/report"),
    ("POST", "/v1/dispatch/logs"),
    ("GET", "/v1/dispatch/active?node=n1"),
]


async def test_public_routes_need_no_token(queue: Queue) -> None:
    r = await queue.call("GET", "/healthz", token=None)
    assert r.status == 200 and r.body == {"status": "ok"}
    r = await queue.call("GET", "/openapi.yaml", token=None)
    assert r.status == 200 and r.text.startswith("openapi: 3.")


async def test_every_other_route_needs_a_known_token(queue: Queue) -> None:
    for method, path in USER_ROUTES + DISPATCH_ROUTES:
        r = await queue.call(method, path, token=None, json_body={})
        assert r.status == 401 and r.body["error"] == "missing_token", (method, path)
        r = await queue.call(method, path, token="nyq_not-a-real-token", json_body={})
        assert r.status == 401 and r.body["error"] == "invalid_token", (method, path)
    r = await queue.call(
        "GET", NS + "/providers", token=None, headers={"Authorization": "Basic Zm9vOmJhcg=="}
    )
    assert r.status == 401


async def test_roles(queue: Queue) -> None:
    for method, path in DISPATCH_ROUTES:
        r = await queue.call(method, path, token="user", json_body={})
        assert r.status == 403 and r.body["error"] == "wrong_role", (method, path)
        assert "--role daemon" in r.body["detail"]
    await add_kind(queue)
    # Daemon credentials (the bootstrap token and a session alike) cannot read user routes
    # either: tenants' providers, modes, env and scripts are not the daemons' business.
    session = await queue.session("d1", "n1")
    for method, path in USER_ROUTES:
        for token in ("daemon", session):
            r = await queue.call(method, path, token=token, json_body=LAUNCH)
            assert r.status == 403 and r.body["error"] == "wrong_role", (method, path)
    # Nothing was launched by the daemon token.
    r = await queue.call("GET", NS + "/providers/kind/instances")
    assert r.body == {"items": []}


async def test_namespace_scope_for_users(queue: Queue) -> None:
    team_a = await queue.token(Role.USER, namespace="team-a")
    await add_kind(queue, namespace="team-a", token=team_a)
    r = await queue.call(
        "POST", "/v1/namespaces/team-a/providers/kind/launch", token=team_a, json_body=LAUNCH
    )
    assert r.status == 202
    for method, path in USER_ROUTES:
        r = await queue.call(method, path.replace("/default/", "/team-b/"), token=team_a, json_body=LAUNCH)
        assert r.status == 403 and r.body["error"] == "wrong_namespace", (method, path)
        assert "team-a" in r.body["detail"]
    # An unscoped user token may use any namespace.
    r = await queue.call("GET", "/v1/namespaces/team-a/providers/kind/instances")
    assert r.status == 200 and len(r.body["items"]) == 1


async def test_namespace_scope_for_daemons(queue: Queue) -> None:
    team_a_user = await queue.token(Role.USER, namespace="team-a")
    await add_kind(queue, namespace="team-a", token=team_a_user)
    await add_kind(queue, namespace="team-b")
    a = (await queue.user("team-a").launch(provider="kind", mode="small", script="print(1)"))["instanceId"]
    b = (await queue.user("team-b").launch(provider="kind", mode="small", script="print(1)"))["instanceId"]

    scoped = queue.client(await queue.token(Role.DAEMON, namespace="team-a"))
    tasks = await scoped.claim(daemon_id="da", node="n1", capacity=10, wait=0)
    assert [t["instanceId"] for t in tasks] == [a]
    # Reports and logs on another namespace's instance change nothing.
    await scoped.report(
        daemon_id="da", stream="da-1", reports=[{"seq": 1, "instanceId": b, "state": "running", "node": "n1"}]
    )
    inst_b = await queue.user("team-b").get_instance(provider="kind", instance_id=b)
    assert inst_b["state"] == "queued" and inst_b["version"] == 1
    with pytest.raises(Exception) as err:
        await scoped.upload_logs(daemon_id="da", instance_id=b, logs="x")
    assert getattr(err.value, "status", None) == 404
    assert await scoped.active(node="n1") == []
    # An unscoped daemon token gets team-b's task.
    tasks = await queue.daemon().claim(daemon_id="db", node="n1", capacity=10, wait=0)
    assert [t["instanceId"] for t in tasks] == [b]


async def test_token_never_logged_or_echoed(
    queue: Queue, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG)
    secret_user = await queue.token(Role.USER, name="bob")
    wrong = "nyq_this-token-does-not-exist-0123456789"
    with structlog.testing.capture_logs() as captured:
        await add_kind(queue, token=secret_user)
        client = queue.client(secret_user)
        accepted = await client.launch(provider="kind", mode="small", script="print(1)")
        assert accepted["state"] == "queued"
        inst = await client.get_instance(provider="kind", instance_id=accepted["instanceId"])
        assert inst["requester"].startswith("bob (tok-")
        assert secret_user not in str(inst)
        bad = queue.client(wrong)
        with pytest.raises(QueueAuthError) as err:
            await bad.list_providers()
        r = await queue.call("GET", NS + "/providers", token=wrong)
        r2 = await queue.call("POST", "/v1/dispatch/claim", token=secret_user, json_body={})
    assert err.value.status == 401
    seen = (
        str(err.value)
        + repr(bad)
        + repr(client)
        + r.text
        + r2.text
        + repr(captured)
        + caplog.text
        + "".join(capsys.readouterr())
    )
    assert "launch accepted" in repr(captured)
    for token in (secret_user, wrong, queue.user_token):
        assert token not in seen
        assert token[4:20] not in seen
    # Only hashes are stored.
    raw = await queue.raw_state()
    assert secret_user.encode() not in raw
