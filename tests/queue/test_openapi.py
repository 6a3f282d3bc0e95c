"""The server against its own OpenAPI document (``nymph/queue/openapi.yaml``).

Every operation of the document is called over real HTTP, for its success and error statuses;
each answer must carry a status the document lists for that operation, and schemathesis checks
the body against the documented schema. A fuzz pass then sends schema-generated requests to
every operation and requires that none gets a 5xx or an undocumented answer.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import hypothesis
import requests
import schemathesis
import yaml
from hypothesis import strategies as st

from tests.support.queue_helpers import REGISTER, Served, identity_of

SPEC: dict[str, Any] = yaml.safe_load(resources.files("nymph.queue").joinpath("openapi.yaml").read_text())
SCHEMA = schemathesis.openapi.from_dict(SPEC)
METHODS = {"get", "put", "post", "delete", "patch", "head"}
ALL_OPERATIONS = {(m.upper(), p) for p, item in SPEC["paths"].items() for m in item if m in METHODS}
NS = "/v1/namespaces/default"
EXAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "examples"


class Conformance:
    def __init__(self, served: Served) -> None:
        self.served = served
        self.session = requests.Session()
        self.seen: set[tuple[str, str]] = set()
        self.statuses: set[int] = set()
        self.sessions: dict[tuple[str, str, tuple[str, ...]], str] = {}

    def daemon_session(self, daemon_id: str, node: str, namespaces: tuple[str, ...]) -> str:
        """A session for this daemon identity, registered (through the documented route) once."""
        key = (daemon_id, node, namespaces)
        if key not in self.sessions:
            body = {"daemonId": daemon_id, "node": node, "namespaces": list(namespaces)}
            resp = self("POST", REGISTER, body=body, token="daemon", expect=201)
            self.sessions[key] = resp.json()["sessionToken"]
        return self.sessions[key]

    def __call__(
        self,
        method: str,
        path: str,
        *,
        expect: int,
        token: str | None = "user",
        body: Any = None,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> requests.Response:
        hdrs = dict(headers or {})
        if token == "daemon" and path.startswith("/v1/dispatch/") and path != REGISTER:
            token = self.daemon_session(*identity_of(body, path))
        if token == "user":
            token = self.served.user_token
        elif token == "daemon":
            token = self.served.daemon_token
        elif token == "admin":
            token = self.served.admin_token
        if token:
            hdrs["Authorization"] = f"Bearer {token}"
        if body is not None:
            data = json.dumps(body).encode()
            hdrs["Content-Type"] = "application/json"
        resp = self.session.request(method, self.served.url + path, data=data, headers=hdrs, timeout=30)
        assert resp.status_code == expect, (method, path, resp.status_code, resp.text)
        op = SCHEMA.find_operation_by_path(method, urlsplit(path).path)
        assert op is not None, f"{method} {path} is not in openapi.yaml"
        documented = SPEC["paths"][op.path][method.lower()]["responses"]
        assert str(resp.status_code) in documented, (
            f"{method} {op.path} answered undocumented {resp.status_code}"
        )
        op.validate_response(resp)
        self.seen.add((method.upper(), op.path))
        self.statuses.add(resp.status_code)
        return resp


def test_every_operation_conforms(served: Served) -> None:
    call = Conformance(served)
    call("GET", "/healthz", expect=200, token=None)
    call("GET", "/openapi.yaml", expect=200, token=None)
    call("GET", "/metrics", expect=200, token="admin")
    call("GET", "/metrics", expect=403)
    kind = {"name": "kind", "launcher": "Kube", "dispatch": "daemon", "kwargs": {"namespace": "jobs"}}
    call("POST", NS + "/providers", body=kind, expect=201)
    call("POST", NS + "/providers", body=kind, expect=409)
    call("POST", NS + "/providers", body={**kind, "launcher": "k8s"}, expect=400)
    call("POST", NS + "/providers", body={**kind, "kwargs": 1}, expect=422)
    call("POST", NS + "/providers", data=b"x" * (1024 * 1024 + 10), expect=413)
    call("POST", NS + "/providers", body=kind, token=None, expect=401)
    call("POST", NS + "/providers", body=kind, token="daemon", expect=403)
    call("GET", NS + "/providers", expect=200)
    call("GET", "/v1/namespaces/Bad/providers", expect=400)
    call("GET", NS + "/providers/kind", expect=200)
    call("GET", NS + "/providers/nope", expect=404)
    call("PUT", NS + "/providers/spare", body={"launcher": "Kube", "dispatch": "daemon"}, expect=200)
    call("DELETE", NS + "/providers/spare", expect=204)
    call("DELETE", NS + "/providers/spare", expect=404)

    small = {"name": "small", "provider": "kind", "fields": {"image": "python:3.12-slim"}}
    call("POST", NS + "/modes", body=small, expect=201)
    call("POST", NS + "/modes", body=small, expect=409)
    call("GET", NS + "/modes", expect=200)
    call("GET", NS + "/modes/small", expect=200)
    call("GET", NS + "/modes/nope", expect=404)
    call("PUT", NS + "/modes/spare", body={"fields": {"image": "busybox"}}, expect=200)
    call("DELETE", NS + "/modes/spare", expect=204)

    launch = NS + "/providers/kind/launch"
    body = {"mode": "small", "script": "print(1)", "tags": {"team": "ml"}}
    accepted = call("POST", launch, body=body, headers={"Idempotency-Key": "k"}, expect=202).json()
    call("POST", launch, body={**body, "script": "print(2)"}, headers={"Idempotency-Key": "k"}, expect=409)
    call("POST", launch, body={"mode": "small", "script": ""}, expect=400)
    call("POST", launch, body={"mode": "ghost", "script": "x"}, expect=404)
    call("POST", launch, body={"script": "x"}, expect=422)
    iid = accepted["instanceId"]
    inst = NS + f"/providers/kind/instances/{iid}"
    call("GET", NS + "/providers/kind/instances?state=queued", expect=200)
    call("GET", NS + "/providers/kind/instances?state=nope", expect=400)
    call("GET", inst, expect=200)
    call("GET", inst + "?after=0&wait=1", expect=200)
    call("GET", NS + "/providers/kind/instances/lakeshore-00000000", expect=404)
    call("GET", inst + "/logs", expect=200)
    call("GET", NS + "/providers/kind/instances/lakeshore-00000000/logs", expect=404)

    retried = {**body, "fields": {"retry": {"limit": 1, "on": ["Error", "exit:1-5"]}}}
    call("POST", launch, body=retried, expect=202)
    call("POST", launch, body={**body, "fields": {"retry": {"limit": 1, "on": ["Nope"]}}}, expect=400)
    launches = NS + "/providers/kind/launches"
    grouped = call(
        "POST", launches, body={**body, "count": 2}, headers={"Idempotency-Key": "g"}, expect=202
    ).json()
    call("POST", launches, body={**body, "count": 3}, headers={"Idempotency-Key": "g"}, expect=409)
    call("POST", launches, body={**body, "items": [{"script": ""}]}, expect=400)
    call("POST", launches, body={**body, "mode": "ghost", "count": 1}, expect=404)
    call("POST", launches, data=b"x" * (16 * 1024 * 1024 + 10), expect=413)
    group = NS + f"/groups/{grouped['groupId']}"
    call("GET", group, expect=200)
    call("GET", group + "/instances?limit=1", expect=200)
    call("GET", NS + "/groups/group-000000000000", expect=404)
    call("GET", NS + "/groups/group-000000000000/instances", expect=404)
    call("DELETE", group, expect=204)
    call("DELETE", group, expect=204)
    call("DELETE", NS + "/groups/group-000000000000", expect=404)

    dock = NS + "/providers/kind/dockyard"
    dock_body = {
        "recipe": yaml.safe_load((EXAMPLES / "dockyard-grpo-vllm.yaml").read_text()),
        "infra": yaml.safe_load((EXAMPLES / "dockyard-grpo-vllm.infra.yaml").read_text()),
        "overrides": ["infra.sandbox.replicas=1"],
    }
    dock_id = call("POST", dock, body=dock_body, headers={"Idempotency-Key": "d"}, expect=202).json()[
        "instanceId"
    ]
    call("POST", dock, body={**dock_body, "overrides": []}, headers={"Idempotency-Key": "d"}, expect=409)
    call("POST", dock, body={**dock_body, "infra": {"colour": 1}}, expect=400)
    call("POST", dock, body={"infra": {}}, expect=422)
    call("POST", NS + "/providers/nope/dockyard", body=dock_body, expect=404)

    task_id = call("POST", NS + "/providers/kind/test", body={}, expect=202).json()["taskId"]
    call("POST", NS + "/providers/kind/test", body={"mode": "ghost"}, expect=404)
    call("GET", NS + f"/tasks/{task_id}", expect=200)
    call("GET", NS + "/tasks/task-nope", expect=404)

    claim = {"daemonId": "d1", "node": "n1", "capacity": 10, "wait": 0}
    call("POST", "/v1/dispatch/claim", body=claim, token="user", expect=403)
    call("POST", "/v1/dispatch/claim", body=claim, token=served.daemon_token, expect=401)
    call("POST", REGISTER, body={"daemonId": "dx", "node": "n9"}, token="daemon", expect=201)
    call("POST", REGISTER, body={"daemonId": "dx", "node": "n1"}, token="daemon", expect=409)
    call("POST", REGISTER, body={"node": "n1"}, token="daemon", expect=422)
    call("POST", "/v1/dispatch/claim", body={**claim, "capacity": -1}, token="daemon", expect=422)
    tasks = call("POST", "/v1/dispatch/claim", body=claim, token="daemon", expect=200).json()["tasks"]
    assert {t["kind"] for t in tasks} == {"launch", "probe", "dockyard"}
    call("GET", NS + "/daemons", expect=200)
    ids = [t["taskId"] for t in tasks]
    call("POST", "/v1/dispatch/renew", body={"daemonId": "d1", "taskIds": ids}, token="daemon", expect=200)
    probe = next(t for t in tasks if t["kind"] == "probe")
    launch_task = next(t for t in tasks if t["kind"] == "launch")
    call(
        "POST",
        "/v1/dispatch/release",
        body={"daemonId": "d1", "taskIds": [probe["taskId"]]},
        token="daemon",
        expect=200,
    )
    done = {"daemonId": "d1", "taskId": launch_task["taskId"], "ok": True}
    call("POST", "/v1/dispatch/complete", body=done, token="daemon", expect=200)
    call("POST", "/v1/dispatch/complete", body={**done, "daemonId": "d2"}, token="daemon", expect=409)
    call("POST", "/v1/dispatch/complete", body={**done, "taskId": "task-x"}, token="daemon", expect=404)
    batch = {
        "daemonId": "d1",
        "completions": [{"taskId": done["taskId"], "ok": True}, {"taskId": "task-x", "ok": True}],
    }
    answers = call("POST", "/v1/dispatch/completions", body=batch, token="daemon", expect=200).json()[
        "answers"
    ]
    assert [(a["httpStatus"], a["body"].get("duplicate") or a["body"].get("error")) for a in answers] == [
        (200, True),
        (404, "task_not_found"),
    ]
    call("POST", "/v1/dispatch/completions", body={"daemonId": "d1"}, token="daemon", expect=422)
    # A dockyard instance stopped while its task is leased: the stop waits, then carries the spec.
    dock_task = next(t for t in tasks if t["kind"] == "dockyard")
    call("DELETE", NS + f"/providers/kind/instances/{dock_id}", expect=204)
    dock_done = {"daemonId": "d1", "taskId": dock_task["taskId"], "ok": True, "result": {"objects": []}}
    call("POST", "/v1/dispatch/complete", body=dock_done, token="daemon", expect=200)
    again = call("POST", "/v1/dispatch/claim", body=claim, token="daemon", expect=200).json()["tasks"]
    [dock_stop] = [t for t in again if t["kind"] == "stop"]
    assert dock_stop["spec"] == {"dockyard": dock_task["spec"]}
    report = {"seq": 1, "instanceId": iid, "state": "running", "node": "n1", "at": "2030-01-01T00:00:00Z"}
    call(
        "POST",
        "/v1/dispatch/report",
        body={"daemonId": "d1", "stream": "s", "reports": [report]},
        token="daemon",
        expect=200,
    )
    call("POST", "/v1/dispatch/report", body={"daemonId": "d1", "stream": "s"}, token="daemon", expect=422)
    # Another node's daemon does not run the instance: what it sends for it is refused.
    other = call.daemon_session("d9", "n9", ())
    forged = {"daemonId": "d9", "stream": "s9", "reports": [{**report, "state": "stopped"}]}
    call("POST", "/v1/dispatch/report", body=forged, token=other, expect=403)
    foreign = {"daemonId": "d9", "instanceId": iid}
    call("POST", "/v1/dispatch/logs", body={**foreign, "logs": "x"}, token=other, expect=403)
    call("POST", "/v1/dispatch/logchunks", body={**foreign, "offset": 0, "data": ""}, token=other, expect=403)
    call("POST", "/v1/dispatch/results", body={**foreign, "error": "x"}, token=other, expect=403)
    call("GET", "/v1/dispatch/active?node=n1", token="daemon", expect=200)
    call("GET", "/v1/dispatch/active", token="daemon", expect=400)
    logs = {"daemonId": "d1", "instanceId": iid, "logs": "hi\n"}
    call("POST", "/v1/dispatch/logs", body=logs, token="daemon", expect=204)
    call(
        "POST",
        "/v1/dispatch/logs",
        body={**logs, "instanceId": "lakeshore-00000000"},
        token="daemon",
        expect=404,
    )
    call("GET", inst + "/logs", expect=200)
    chunk = {"daemonId": "d1", "instanceId": iid, "offset": 0, "data": base64.b64encode(b"hello\n").decode()}
    call("POST", "/v1/dispatch/logchunks", body=chunk, token="daemon", expect=200)
    call("POST", "/v1/dispatch/logchunks", body={**chunk, "offset": 99}, token="daemon", expect=409)
    call("POST", "/v1/dispatch/logchunks", body={**chunk, "data": "%%"}, token="daemon", expect=422)
    call(
        "POST",
        "/v1/dispatch/logchunks",
        body={**chunk, "instanceId": "lakeshore-00000000"},
        token="daemon",
        expect=404,
    )
    assert call("GET", inst + "/logs?since=2", expect=200).json()["logs"] == "llo\n"
    call("GET", inst + "/logs?follow=maybe", expect=400)
    plain = {"Accept": "text/plain"}
    assert call("GET", inst + "/logs?follow=false", headers=plain, expect=200).text == "hello\n"
    item = {k: v for k, v in chunk.items() if k != "daemonId"}
    more = {**item, "offset": 6, "data": base64.b64encode(b"more\n").decode()}
    batch = {
        "daemonId": "d1",
        "chunks": [
            more,
            {**item, "offset": 99},
            {**item, "data": "%%"},
            {**item, "instanceId": "lakeshore-00000000"},
            more,
        ],
    }
    answers = call("POST", "/v1/dispatch/logchunks/batch", body=batch, token="daemon", expect=200).json()[
        "answers"
    ]
    assert [(a["httpStatus"], a["body"].get("size") or a["body"].get("error")) for a in answers] == [
        (200, 11),
        (409, "log_gap"),
        (422, "invalid_body"),
        (404, "instance_not_found"),
        (200, 11),
    ]
    call("POST", "/v1/dispatch/logchunks/batch", body={"daemonId": "d1"}, token="daemon", expect=422)
    done_chunk = {**chunk, "offset": 11, "data": "", "final": True}
    call("POST", "/v1/dispatch/logchunks", body=done_chunk, token="daemon", expect=200)
    followed = call("GET", inst + "/logs?follow=true", expect=200)
    assert followed.text == "hello\nmore\n" and followed.headers["X-Nymph-Log-Complete"] == "true"
    result = {"daemonId": "d1", "instanceId": iid, "path": "a/b.txt", "offset": 0, "data": chunk["data"]}
    call("POST", "/v1/dispatch/results", body={**result, "eof": True}, token="daemon", expect=200)
    call("POST", "/v1/dispatch/results", body={**result, "offset": 99}, token="daemon", expect=200)
    call("POST", "/v1/dispatch/results", body={**result, "path": "../x"}, token="daemon", expect=422)
    call(
        "POST",
        "/v1/dispatch/results",
        body={**result, "instanceId": "lakeshore-00000000"},
        token="daemon",
        expect=404,
    )
    listed = call("GET", inst + "/results", expect=200).json()
    assert listed["items"] == [{"path": "a/b.txt", "size": 6}]
    assert call("GET", inst + "/results/a%2Fb.txt", expect=200).content == b"hello\n"
    call("GET", inst + "/results/a%2Fnope", expect=404)
    call("GET", inst + "/results/a%2F..%2Fb", expect=400)
    call("GET", NS + "/providers/kind/instances/lakeshore-00000000/results", expect=404)
    call("DELETE", inst, expect=204)
    full = call("GET", inst, expect=200).json()
    assert full["state"] == "stopping" and [h["state"] for h in full["history"]] == [
        "queued",
        "running",
        "stopping",
    ]
    call("DELETE", NS + "/providers/kind/instances/lakeshore-00000000", expect=404)

    events = call("GET", NS + "/events?limit=2", expect=200).json()
    assert len(events["items"]) == 2
    call("GET", NS + f"/events?after={events['continue']}&provider=kind&instance={iid}", expect=200)
    call("GET", NS + "/events?after=x", expect=400)
    call("GET", NS + "/events", token="daemon", expect=403)

    call("PUT", NS + "/secrets/kc", body={"value": "apiVersion: v1\nusers: []\n"}, expect=200)
    call("PUT", NS + "/secrets/kc", body={"value": ""}, expect=422)
    call("PUT", NS + "/secrets/bad%20name", body={"value": "x"}, expect=400)
    call("GET", NS + "/secrets", expect=200)
    call("DELETE", NS + "/secrets/kc", expect=204)
    call("DELETE", NS + "/secrets/kc", expect=404)

    call("GET", NS + "/quota", expect=200)
    call("PUT", NS + "/quota", body={"maxRunning": 5}, expect=403)
    call("PUT", NS + "/quota", body={"maxRunning": "5"}, token="admin", expect=400)
    quota = {
        "weight": 2,
        "maxRunning": 5,
        "resources": {"cpu": "8"},
        "maxRuntime": "2h",
        "defaultRuntime": None,
    }
    call("PUT", NS + "/quota", body=quota, token="admin", expect=200)
    call("GET", "/v1/quotas", token="admin", expect=200)
    call("GET", "/v1/quotas", expect=403)

    assert call.seen == ALL_OPERATIONS, sorted(ALL_OPERATIONS - call.seen)
    assert {400, 401, 403, 404, 409, 413, 422} <= call.statuses


def test_the_check_can_fail(served: Served) -> None:
    """A response that drifts from the document is caught (so the test above means something)."""
    s = requests.Session()
    r = s.get(served.url + "/healthz", timeout=10)
    op = SCHEMA.find_operation_by_path("GET", "/healthz")
    assert op is not None
    op.validate_response(r)
    r._content = b'{"status": "ok", "extra": 1}'
    assert "extra" in _failure(lambda: op.validate_response(r))
    r._content = b'{"status": 5}'
    assert "5 is not of type" in _failure(lambda: op.validate_response(r))


def _failure(check: Callable[[], object]) -> str:
    try:
        check()
    except BaseException as exc:  # schemathesis raises a BaseExceptionGroup of failures
        return "\n".join([str(exc), *(str(e) for e in getattr(exc, "exceptions", ()))])
    raise AssertionError("the drifted response passed validation")


def test_fuzzed_requests_get_documented_answers(served: Served) -> None:
    """Schema-generated requests (valid and invalid) never get a 5xx or an undocumented status."""
    session = requests.Session()
    auth = {"Authorization": f"Bearer {served.user_token}"}
    registered = session.post(
        served.url + REGISTER,
        json={"daemonId": "fuzz", "node": "n1"},
        headers={"Authorization": f"Bearer {served.daemon_token}"},
        timeout=30,
    )
    assert registered.status_code == 201, registered.text
    daemon = {"Authorization": f"Bearer {registered.json()['sessionToken']}"}
    bootstrap = {"Authorization": f"Bearer {served.daemon_token}"}
    ops = [op.ok() for op in SCHEMA.get_all_operations()]

    @hypothesis.settings(
        max_examples=120,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    @hypothesis.given(data=st.data())
    def run(data: st.DataObject) -> None:
        op = data.draw(st.sampled_from(ops))
        mode = data.draw(
            st.sampled_from([schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE])
        )
        case = data.draw(op.as_strategy(generation_mode=mode))
        headers = auth
        if op.path.startswith("/v1/dispatch"):
            headers = bootstrap if op.path == REGISTER else daemon
        if op.path.startswith("/v1/dispatch/claim") and isinstance(case.body, dict):
            case.body["wait"] = 0
        if "wait" in (case.query or {}):
            case.query["wait"] = 0
        if "follow" in (case.query or {}):
            case.query["follow"] = "false"  # a followed event stream never ends
        response = case.call(base_url=served.url, session=session, headers=headers, timeout=30)
        assert response.status_code < 500, (case.method, case.path, response.text)
        documented = SPEC["paths"][op.path][op.method.lower()]["responses"]
        assert str(response.status_code) in documented, (
            case.method,
            case.formatted_path,
            response.status_code,
        )
        op.validate_response(response)
        seen.add((op.method.upper(), op.path, response.status_code))

    seen: set[tuple[str, str, int]] = set()
    run()
    assert len({(method, path) for method, path, _ in seen}) >= 10  # the fuzz reached most routes
