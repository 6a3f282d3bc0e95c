"""The Pod watch keeps events as plain JSON: no generated model is built per event."""

from __future__ import annotations

import json

from nymph.kube.watch import RawWatch

EVENT = {
    "type": "MODIFIED",
    "object": {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "lakeshore-0123abcd",
            "resourceVersion": "42",
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "status": {"phase": "Running"},
    },
}


async def test_events_stay_plain_json_and_the_resource_version_is_kept() -> None:
    w = RawWatch()
    try:
        event = w.unmarshal_event(json.dumps(EVENT), w.get_return_type(None))
    finally:
        await w._api_client.close()
    assert event["object"] == EVENT["object"] and event["raw_object"] is event["object"]
    assert isinstance(event["object"], dict) and w.resource_version == "42"
