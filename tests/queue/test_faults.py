"""Bodies that do not decode, requests the HTTP parser refuses, instance id collisions and
launches the daemon could not render: every error a documented 4xx."""

from __future__ import annotations

import asyncio
import gzip
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.queue_helpers import Queue

NS = "/v1/namespaces/default"
CLAIM = "/v1/dispatch/claim"
LAUNCH = NS + "/providers/kind/launch"


async def _raw(q: Queue, request: bytes) -> tuple[int, bytes]:
    host, port = q.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(request)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


def _json_error(body: bytes) -> dict[str, str]:
    import json

    data = json.loads(body)
    assert set(data) == {"error", "detail"}, data
    return data  # type: ignore[no-any-return]


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "x-gzip", "gzip, deflate"])
async def test_corrupt_compressed_body_is_a_400(kind: Queue, encoding: str) -> None:
    for body in (b"garbage!!", zlib.compress(b'{"mode": "small"}')[:6], gzip.compress(b"{}")[:-3]):
        r = await kind.call(
            "POST",
            LAUNCH,
            data=body,
            headers={"Content-Type": "application/json", "Content-Encoding": encoding},
        )
        assert r.status == 400, (encoding, r.status, r.text)
        assert r.body["error"] == "invalid_encoding", r.body


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [("gzip", gzip.compress), ("deflate", zlib.compress), ("deflate", lambda b: zlib.compress(b)[2:-4])],
)
async def test_compressed_bodies_still_work(kind: Queue, encoding: str, compress: object) -> None:
    body = compress(b'{"mode": "small", "script": "print(1)"}')  # type: ignore[operator]
    r = await kind.call(
        "POST", LAUNCH, data=body, headers={"Content-Type": "application/json", "Content-Encoding": encoding}
    )
    assert r.status == 202, r.text


@pytest.mark.parametrize("encoding", ["br", "zstd", "compress", "foo"])
async def test_unknown_encoding_is_a_415(kind: Queue, encoding: str) -> None:
    r = await kind.call(
        "POST", LAUNCH, data=b"{}", headers={"Content-Type": "application/json", "Content-Encoding": encoding}
    )
    assert r.status == 415, (r.status, r.text)
    assert r.body["error"] == "unsupported_encoding"


async def test_gzip_bomb_is_a_413(kind: Queue) -> None:
    bomb = gzip.compress(b'{"script": "' + b" " * (8 * 1024 * 1024) + b'"}')
    r = await kind.call(
        "POST", LAUNCH, data=bomb, headers={"Content-Type": "application/json", "Content-Encoding": "gzip"}
    )
    assert r.status == 413 and r.body["error"] == "too_large", r.text


@pytest.mark.parametrize("method", [b"FOO", b"BREW", b"G@T"])
async def test_unknown_method_is_json_405(queue: Queue, method: bytes) -> None:
    status, body = await _raw(
        queue, method + b" /v1/dispatch/claim HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    assert status == 405
    assert _json_error(body)["error"] == "method_not_allowed"


async def test_malformed_request_is_json_400(queue: Queue) -> None:
    status, body = await _raw(queue, b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n")
    assert status == 400
    assert _json_error(body)["error"] == "bad_request"


async def test_instance_id_collision_retries_with_a_fresh_id(
    kind: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nymph.launch.spec import LaunchSpec
    from nymph.queue.sql import launches

    user = kind.user()
    first = (await user.launch(provider="kind", mode="small", script="print(1)"))["instanceId"]
    fresh = "lakeshore-0000beef"
    ids = iter([first, first, fresh])
    monkeypatch.setattr(launches, "new_instance_id", lambda: next(ids))
    accepted = await user.launch(provider="kind", mode="small", script="print(2)", idempotency_key="k1")
    assert accepted["instanceId"] == fresh
    # The same key and body answer the same instance; the task's spec names the id it got.
    assert (
        await user.launch(provider="kind", mode="small", script="print(2)", idempotency_key="k1") == accepted
    )
    tasks = await kind.daemon().claim(daemon_id="d1", node="n1", capacity=5, wait=0)
    by_instance = {t["instanceId"]: t for t in tasks}
    assert set(by_instance) == {first, fresh}
    spec = by_instance[fresh]["spec"]
    assert spec is not None and LaunchSpec.from_json(spec).instance_id == fresh
    assert (
        LaunchSpec.from_json(spec).launch_uid
        != LaunchSpec.from_json(by_instance[first]["spec"] or {}).launch_uid
    )
    assert (await user.get_instance(provider="kind", instance_id=first))["state"] == "queued"


async def test_instance_ids_exhausted_is_a_409(kind: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    from nymph.queue.sql import launches

    user = kind.user()
    first = (await user.launch(provider="kind", mode="small", script="print(1)"))["instanceId"]
    monkeypatch.setattr(launches, "new_instance_id", lambda: first)
    r = await kind.call("POST", LAUNCH, json_body={"mode": "small", "script": "print(2)"})
    assert r.status == 409 and r.body["error"] == "instance_id_taken", r.body
    from tests.queue.test_dockyard import BODY

    ids = iter([first, "lakeshore-0000abcd"])
    monkeypatch.setattr(launches, "new_instance_id", lambda: next(ids))
    r = await kind.call("POST", NS + "/providers/kind/dockyard", json_body=BODY)
    assert r.status == 202 and r.body["instanceId"] == "lakeshore-0000abcd", r.body


async def test_script_with_no_free_delimiter_byte_is_accepted_and_renders(
    kind: Queue, tmp_path: Path
) -> None:
    from nymph.launch.render import _LEADS, render_pod, to_yaml
    from nymph.launch.spec import LaunchSpec

    script = "\n".join(['s = """', *(f"{c}x" for c in _LEADS), "N\u00e9", '"""', "print('ok')"]) + "\n"
    r = await kind.call("POST", LAUNCH, json_body={"mode": "small", "script": script})
    assert r.status == 202, r.body
    [task] = await kind.daemon().claim(daemon_id="d1", node="n1", capacity=1, wait=0)
    assert task["spec"] is not None
    pod = render_pod(LaunchSpec.from_json(task["spec"]), node="n1", workdir_root="/w")
    arg = yaml.safe_load(to_yaml(pod))["spec"]["containers"][0]["args"][0]
    out, written = await asyncio.to_thread(_run_pod_command, arg, tmp_path / "u.py")
    assert out == "ok\n"
    assert written == script.encode("utf-8")


def _run_pod_command(arg: str, target: Path) -> tuple[str, bytes]:
    """Run a rendered container command under dash (or /bin/sh) with the script at ``target``."""
    cmd = arg.replace("/tmp/u.py", str(target)).replace("python3", sys.executable)
    shell = "/bin/dash" if Path("/bin/dash").exists() else "/bin/sh"
    done = subprocess.run([shell, "-c", cmd], capture_output=True, text=True, check=True, timeout=60)
    return done.stdout, target.read_bytes()


def _nest(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tolerations", [{"key": "k", "value": _nest(900)}]),
        ("resources", {"requests": {"cpu": "1"}, "claims": _nest(900)}),
        ("env", {"A": _nest(900)}),
    ],
)
async def test_nesting_beyond_the_documented_limit_is_a_400_naming_the_field(
    kind: Queue, field: str, value: Any
) -> None:
    body = {"mode": "small", "script": "print(1)", "fields": {field: value}}
    r = await kind.call("POST", LAUNCH, json_body=body)
    assert r.status == 400 and r.body["error"] == "invalid_launch", r.body
    assert r.body["detail"].startswith(f"launch.fields.{field}:"), r.body
    # the same through a mode: named as the mode's field
    r = await kind.call(
        "PUT",
        NS + "/modes/deep",
        json_body={"name": "deep", "provider": "kind", "fields": {"image": "python:3.12", field: value}},
    )
    assert r.status in (200, 201, 400), r.body
    if r.status != 400:
        r = await kind.call("POST", LAUNCH, json_body={"mode": "deep", "script": "print(1)"})
        assert r.status == 400 and r.body["detail"].startswith(f"mode.{field}:"), r.body
    assert await kind.daemon().claim(daemon_id="d1", node="n1", capacity=5, wait=0) == []


async def test_deep_tags_are_a_400(kind: Queue) -> None:
    r = await kind.call(
        "POST", LAUNCH, json_body={"mode": "small", "script": "print(1)", "tags": {"a": _nest(900)}}
    )
    assert r.status == 400 and r.body["detail"].startswith("launch.tags"), r.body
