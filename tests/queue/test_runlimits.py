"""``priority`` and ``max_runtime`` through the real queue (both backends): refused with a 400
naming the field before anything is stored, and carried in the claimed task's spec when valid
(the CLI's forms are in tests/cli/test_runlimits.py)."""

from __future__ import annotations

from typing import Any

import pytest

from nymph.client import QueueClient
from nymph.launch.spec import LaunchSpec
from tests.support.queue_helpers import Queue

NS = "/v1/namespaces/default"
LAUNCH = NS + "/providers/kind/launch"
INSTANCES = NS + "/providers/kind/instances"


async def _claimed_spec(d: QueueClient) -> dict[str, Any]:
    """The spec of the one task ``d`` (one daemon session, keeping its leases) claims next."""
    [task] = await d.claim(daemon_id="d1", node="n1", capacity=5, wait=0)
    spec: dict[str, Any] = task["spec"]
    return spec


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"priority": 1001}, "launch.priority"),
        ({"priority": -1001}, "launch.priority"),
        ({"priority": True}, "launch.priority"),
        ({"priority": 1.5}, "launch.priority"),
        ({"priority": "10"}, "launch.priority"),
        ({"fields": {"priority": "high"}}, "launch.fields.priority"),
        ({"fields": {"max_runtime": "soon"}}, "launch.fields.max_runtime"),
        ({"fields": {"max_runtime": 0}}, "launch.fields.max_runtime"),
        ({"fields": {"max_runtime": "1.5h"}}, "launch.fields.max_runtime"),
        ({"fields": {"max_runtime": "400d"}}, "launch.fields.max_runtime"),
        ({"fields": {"max_runtime": True}}, "launch.fields.max_runtime"),
    ],
)
async def test_a_bad_priority_or_max_runtime_is_a_400_that_stores_nothing(
    kind: Queue, extra: dict[str, Any], needle: str
) -> None:
    before = await kind.raw_state()
    r = await kind.call("POST", LAUNCH, json_body={"mode": "small", "script": "print(1)", **extra})
    assert r.status == 400, r.body
    assert r.body["detail"].startswith(needle + ": "), r.body
    if "max_runtime" in needle:
        assert "'2h'" in r.body["detail"] or "longer than" in r.body["detail"]
    assert (await kind.call("GET", INSTANCES)).body == {"items": []}
    assert await kind.daemon().claim(daemon_id="d1", node="n1", capacity=5, wait=0) == []
    if kind.backend == "sqlite":
        assert (await kind.raw_state()).count(b"lakeshore-") == before.count(b"lakeshore-")


@pytest.mark.parametrize(
    ("fields", "needle"),
    [({"priority": 5000}, "mode.priority"), ({"max_runtime": "forever"}, "mode.max_runtime")],
)
async def test_a_mode_with_a_bad_one_is_refused_naming_the_field(
    kind: Queue, fields: dict[str, Any], needle: str
) -> None:
    r = await kind.call(
        "POST",
        NS + "/modes",
        json_body={"name": "bad", "provider": "kind", "fields": {"image": "x", **fields}},
    )
    assert r.status == 400 and needle in r.body["detail"], r.body
    assert (await kind.call("GET", NS + "/modes/bad")).status == 404


async def test_the_claimed_spec_carries_them_and_the_launch_wins_over_the_mode(kind: Queue) -> None:
    r = await kind.call(
        "POST",
        NS + "/modes",
        json_body={
            "name": "capped",
            "provider": "kind",
            "fields": {"image": "python:3.12-slim", "priority": 10, "max_runtime": "30m"},
        },
    )
    assert r.status == 201, r.body
    d = kind.daemon()

    r = await kind.call("POST", LAUNCH, json_body={"mode": "capped", "script": "print(1)"})
    assert r.status == 202, r.body
    spec = await _claimed_spec(d)
    assert spec["priority"] == 10 and spec["maxRuntime"] == 1800
    assert LaunchSpec.from_json(spec).max_runtime == 1800

    body = {"mode": "capped", "script": "print(1)", "priority": -4, "fields": {"max_runtime": "2h"}}
    r = await kind.call("POST", LAUNCH, json_body=body)
    assert r.status == 202, r.body
    spec = await _claimed_spec(d)
    assert spec["priority"] == -4 and spec["maxRuntime"] == 7200

    r = await kind.call("POST", LAUNCH, json_body={"mode": "small", "script": "print(1)"})
    assert r.status == 202, r.body
    spec = await _claimed_spec(d)
    assert "priority" not in spec and "maxRuntime" not in spec
