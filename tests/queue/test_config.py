"""Providers and modes over real HTTP: CRUD, validation, and every error status."""

from __future__ import annotations

from nymph.launch.config import Provider
from tests.support.queue_helpers import Queue

P = "/v1/namespaces/default/providers"
M = "/v1/namespaces/default/modes"


async def test_provider_crud(queue: Queue) -> None:
    kwargs = {"namespace": "jobs", "context": "kind-kind"}
    body = {"name": "kind", "launcher": "Kube", "dispatch": "direct", "kwargs": kwargs}
    r = await queue.call("POST", P, json_body=body)
    assert r.status == 201
    assert r.body == Provider(name="kind", kwargs=kwargs, dispatch="direct").to_json()

    r = await queue.call("GET", P + "/kind")
    assert r.status == 200 and r.body["kwargs"] == {"namespace": "jobs", "context": "kind-kind"}
    r = await queue.call("GET", P)
    assert [p["name"] for p in r.body["items"]] == ["kind"]

    r = await queue.call("POST", P, json_body=body)
    assert r.status == 409 and r.body["error"] == "provider_exists"
    assert "PUT" in r.body["detail"]

    r = await queue.call("PUT", P + "/kind", json_body={"launcher": "Kube", "kwargs": {"namespace": "other"}})
    assert r.status == 200 and r.body["kwargs"] == {"namespace": "other"}

    r = await queue.call("DELETE", P + "/kind")
    assert r.status == 204
    for method in ("GET", "DELETE"):
        r = await queue.call(method, P + "/kind")
        assert r.status == 404 and r.body["error"] == "provider_not_found"
    # Namespaces are separate.
    r = await queue.call("GET", "/v1/namespaces/other/providers")
    assert r.body == {"items": []}


async def test_launcher_must_be_exactly_kube(queue: Queue) -> None:
    for launcher in ("k8s", "K8S", "kube", "local", None, 5):
        r = await queue.call("POST", P, json_body={"name": "x", "launcher": launcher, "kwargs": {}})
        assert r.status == 400, launcher
        assert r.body["error"] == "unsupported_launcher"
        assert "'Kube'" in r.body["detail"]
    r = await queue.call("GET", P)
    assert r.body == {"items": []}


async def test_provider_bad_bodies(queue: Queue) -> None:
    cases = [
        (b"{not json", 400, "invalid_json"),
        (b"[1, 2]", 422, "invalid_body"),
        (b"", 422, "missing_body"),
        (b'{"name": "x", "launcher": "Kube", "kwargs": [1]}', 422, "invalid_body"),
        (b'{"name": 7, "launcher": "Kube"}', 422, "invalid_body"),
        (b'{"name": "x", "launcher": "Kube", "colour": "red"}', 422, "invalid_body"),
        (b'{"name": "x", "launcher": "Kube", "kwargs": {"imag": "py"}}', 400, "invalid_provider"),
        (b'{"name": "x", "launcher": "Kube", "dispatch": "kubectl"}', 400, "invalid_provider"),
        (
            b'{"name": "x", "launcher": "Kube", "dispatch": "daemon", "kwargs": {"context": "c"}}',
            400,
            "invalid_provider",
        ),
        (b'{"name": "a/b", "launcher": "Kube"}', 400, "invalid_name"),
        (b"\xff\xfe", 400, "invalid_json"),
    ]
    for raw, status, code in cases:
        r = await queue.call("POST", P, data=raw, headers={"Content-Type": "application/json"})
        assert (r.status, r.body["error"]) == (status, code), raw
        assert r.body["detail"].strip()


async def test_inline_kubeconfig_moves_into_the_secret_store_and_paths_need_an_allowed_dir(
    queue: Queue,
) -> None:
    secret = (
        "apiVersion: v1\nclusters: []\ncontexts: []\nusers:\n- name: x\n  user: {token: s3cr3t-material}\n"
    )
    r = await queue.call(
        "POST",
        P,
        json_body={"name": "x", "launcher": "Kube", "dispatch": "direct", "kwargs": {"kubeconfig": secret}},
    )
    assert r.status == 201 and r.body["kwargs"]["kubeconfig"] == {"$secret": "provider.x.kubeconfig"}
    assert "s3cr3t" not in r.text
    r = await queue.call("GET", "/v1/namespaces/default/secrets")
    assert [i["name"] for i in r.body["items"]] == ["provider.x.kubeconfig"] and "s3cr3t" not in r.text
    for path in ("/etc/kube/config", "~/.kube/config"):
        body = {"launcher": "Kube", "dispatch": "direct", "kwargs": {"kubeconfig": path}}
        r = await queue.call("PUT", P + "/x", json_body=body)
        assert r.status == 400 and r.body["error"] == "kubeconfig_path_refused", path
        assert "--kubeconfig-dir" in r.body["detail"]
    ref = {"$secret": "team-kubeconfig"}
    r = await queue.call(
        "PUT", P + "/x", json_body={"launcher": "Kube", "dispatch": "direct", "kwargs": {"kubeconfig": ref}}
    )
    assert r.status == 200
    r = await queue.call(
        "PUT", P + "/x", json_body={"launcher": "Kube", "dispatch": "daemon", "kwargs": {"kubeconfig": ref}}
    )
    assert r.status == 400 and "means nothing on a 'dispatch: daemon' provider" in r.body["detail"]


async def test_a_provider_that_names_no_dispatch_is_direct(queue: Queue) -> None:
    r = await queue.call("POST", P, json_body={"name": "plain", "launcher": "Kube"})
    assert r.status == 201 and r.body["dispatch"] == "direct"


async def test_body_size_is_capped(queue: Queue) -> None:
    big = b'{"name": "x", "launcher": "Kube", "kwargs": {"context": "' + b"a" * (1024 * 1024) + b'"}}'
    r = await queue.call("POST", P, data=big, headers={"Content-Type": "application/json"})
    assert r.status == 413 and r.body["error"] == "too_large"


async def test_mode_crud_and_errors(queue: Queue) -> None:
    r = await queue.call(
        "POST", M, json_body={"name": "small", "provider": "nope", "fields": {"image": "py"}}
    )
    assert r.status == 400 and r.body["error"] == "unknown_provider"
    await queue.call("POST", P, json_body={"name": "kind", "launcher": "Kube"})
    mode = {"name": "small", "provider": "kind", "fields": {"image": "python:3.12-slim"}}
    r = await queue.call("POST", M, json_body=mode)
    assert r.status == 201 and r.body == mode
    r = await queue.call("POST", M, json_body=mode)
    assert r.status == 409 and r.body["error"] == "mode_exists"
    r = await queue.call("POST", M, json_body={"name": "loose", "fields": {"image": "busybox"}})
    assert r.status == 201 and r.body["provider"] is None
    r = await queue.call("GET", M)
    assert [m["name"] for m in r.body["items"]] == ["loose", "small"]
    r = await queue.call("GET", M + "/small")
    assert r.body == mode
    r = await queue.call("POST", M, json_body={"name": "bad", "fields": {"cpu": 4}})
    assert r.status == 400 and r.body["error"] == "invalid_mode" and "cpu" in r.body["detail"]
    r = await queue.call("POST", M, json_body={"name": "bad", "fields": "image=x"})
    assert r.status == 422
    r = await queue.call("PUT", M + "/small", json_body={"provider": "kind", "fields": {"image": "busybox"}})
    assert r.status == 200 and r.body["fields"] == {"image": "busybox"}
    r = await queue.call("PUT", M + "/small", json_body={"name": "other"})
    assert r.status == 400 and r.body["error"] == "name_mismatch"
    assert (await queue.call("DELETE", M + "/small")).status == 204
    r = await queue.call("GET", M + "/small")
    assert r.status == 404 and r.body["error"] == "mode_not_found"
    assert (await queue.call("DELETE", M + "/small")).status == 404


async def test_namespace_routes_and_unknown_routes(queue: Queue) -> None:
    for ns in ("Bad_NS", "a" * 64, "-x"):
        r = await queue.call("GET", f"/v1/namespaces/{ns}/providers")
        assert r.status == 400 and r.body["error"] == "invalid_namespace", ns
    r = await queue.call("GET", "/v1/nothing-here")
    assert r.status == 404 and r.body["error"] == "not_found"
    r = await queue.call("PATCH", P)
    assert r.status == 405 and r.body["error"] == "method_not_allowed"


async def test_hostile_json_is_a_400_not_a_500(queue: Queue) -> None:
    hostile = [
        b'{"name": "x", "launcher": "Kube", "kwargs": {"context": NaN}}',
        b'{"name": "x", "launcher": "Kube", "kwargs": {"context": "\\ud800"}}',
        b"[" * 100_000 + b"]" * 100_000,
    ]
    for raw in hostile:
        r = await queue.call("POST", P, data=raw, headers={"Content-Type": "application/json"})
        assert r.status == 400 and r.body["error"] == "invalid_json", raw[:60]
    r = await queue.call(
        "POST",
        "/v1/dispatch/report",
        token="daemon",
        json_body={
            "daemonId": "d",
            "stream": "s",
            "reports": [
                {
                    "seq": 1,
                    "instanceId": "lakeshore-00000000",
                    "state": "running",
                    "at": "0001-01-01T00:00:00+01:00",
                }
            ],
        },
    )
    assert r.status == 422 and "reports[0].at" in r.body["detail"]
