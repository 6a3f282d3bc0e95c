"""The Pod watch keeps events as plain JSON: no generated model is built per event."""

from __future__ import annotations

import json

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

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


async def test_a_bookmark_moves_the_resource_version_and_an_error_event_raises_as_the_client_does() -> None:
    w = RawWatch()
    try:
        bookmark = {"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "77"}}}
        assert (
            w.unmarshal_event(json.dumps(bookmark), "")["raw_object"]["metadata"]["resourceVersion"] == "77"
        )
        assert w.resource_version == "77"
        gone = {
            "type": "ERROR",
            "object": {"kind": "Status", "code": 410, "reason": "Gone", "message": "too old"},
        }
        with pytest.raises(ApiException) as raised:
            w.unmarshal_event(json.dumps(gone), "")
        assert raised.value.status == 410
        with pytest.raises(Exception, match="resourceVersion"):
            w.unmarshal_event(json.dumps({"type": "BOOKMARK", "object": {"metadata": {}}}), "")
        # not JSON at all: handed back as it came, as the client's own method does
        assert w.unmarshal_event(b"not json", "") == b"not json"
        assert w.resource_version == "77"
    finally:
        await w._api_client.close()
