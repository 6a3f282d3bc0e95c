"""The paged lists against the OpenAPI document: real answers of every paged route (a first
page with ``continue``, the next page without, a bad ``limit`` and a bad token) are validated
against ``nymph/queue/openapi.yaml`` by the conformance check of :mod:`test_openapi`, and
the document declares ``limit`` and ``continue`` on each of them."""

from __future__ import annotations

from tests.queue.test_openapi import SPEC, Conformance
from tests.support.queue_helpers import Served

NS = "/v1/namespaces/default"
PAGED = {
    "/v1/namespaces/{ns}/providers": NS + "/providers",
    "/v1/namespaces/{ns}/modes": NS + "/modes",
    "/v1/namespaces/{ns}/providers/{name}/instances": NS + "/providers/kind/instances",
    "/v1/namespaces/{ns}/secrets": NS + "/secrets",
    "/v1/namespaces/{ns}/daemons": NS + "/daemons",
}


def test_the_document_declares_paging_on_every_list() -> None:
    for path in PAGED:
        op = SPEC["paths"][path]["get"]
        refs = {p.get("$ref") for p in op["parameters"]}
        assert {"#/components/parameters/limit", "#/components/parameters/continue"} <= refs, path
        schema = op["responses"]["200"]["content"]["application/json"]["schema"]
        assert schema["properties"]["continue"] == {"$ref": "#/components/schemas/ContinueToken"}, path
        assert schema["required"] == ["items"], path
    limit = SPEC["components"]["parameters"]["limit"]["schema"]
    assert (limit["minimum"], limit["maximum"], limit["default"]) == (1, 5000, 500)


def test_paged_answers_conform(served: Served) -> None:
    call = Conformance(served)
    for name in ("kind", "spare"):
        body = {"name": name, "launcher": "Kube", "dispatch": "daemon", "kwargs": {"namespace": "jobs"}}
        call("POST", NS + "/providers", body=body, expect=201)
    for name in ("small", "large"):
        mode = {"name": name, "provider": "kind", "fields": {"image": "python:3.12-slim"}}
        call("POST", NS + "/modes", body=mode, expect=201)
    for _ in range(3):
        call("POST", NS + "/providers/kind/launch", body={"mode": "small", "script": "print(1)"}, expect=202)
    for name in ("a", "b"):
        call("PUT", f"{NS}/secrets/{name}", body={"value": "v"}, expect=200)
    for daemon, node in (("d1", "n1"), ("d2", "n2")):
        body = {"daemonId": daemon, "node": node, "namespaces": [], "capacity": 0, "wait": 0}
        call("POST", "/v1/dispatch/claim", body=body, token="daemon", expect=200)

    for path in PAGED.values():
        first = call("GET", path + "?limit=1", expect=200).json()
        assert len(first["items"]) == 1 and first["continue"], path
        rest = call("GET", f"{path}?limit=5000&continue={first['continue']}", expect=200).json()
        assert rest["items"] and "continue" not in rest, path
        for bad in ("0", "5001", "x"):
            err = call("GET", f"{path}?limit={bad}", expect=400).json()
            assert err["error"] == "invalid_query" and "limit" in err["detail"], path
        err = call("GET", path + "?continue=not-a-token", expect=400).json()
        assert err["error"] == "invalid_continue", path
    filtered = call(
        "GET", PAGED["/v1/namespaces/{ns}/providers/{name}/instances"] + "?state=queued&limit=2", expect=200
    )
    assert len(filtered.json()["items"]) == 2 and filtered.json()["continue"]
