"""The Pod watch keeps events as plain JSON: no generated model is built per event."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes_asyncio.client.exceptions import ApiException

from nymph.kube.watch import RawWatch, without_managed_fields

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


def _pod_event(labels: dict[str, str], annotations: dict[str, str], managed: list[dict[str, Any]]) -> str:
    """A Pod's watch event as the API server writes it: compact, ``managedFields`` last in the
    metadata, the spec after the metadata."""
    pod = {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": "lakeshore-0123abcd",
            "namespace": "jobs",
            "resourceVersion": "42",
            "labels": labels,
            "annotations": annotations,
            "managedFields": managed,
        },
        "spec": {"nodeName": "n1", "containers": [{"name": "user", "image": "python:3.12-slim"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    return json.dumps({"type": "MODIFIED", "object": pod}, separators=(",", ":"))


def _managed(fields: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "manager": "nymph",
            "operation": "Update",
            "apiVersion": "v1",
            "time": "2026-01-01T00:00:00Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": fields,
        },
        {
            "manager": "kwok",
            "operation": "Update",
            "fieldsType": "FieldsV1",
            "fieldsV1": {},
            "subresource": "status",
        },
    ]


def _decoded_whole(data: str) -> dict[str, Any]:
    event: dict[str, Any] = json.loads(data)
    event["object"]["metadata"].pop("managedFields", None)
    return event


def test_an_events_managed_fields_are_cut_out_before_it_is_decoded() -> None:
    """The markers the cut looks for, written as text in label and annotation values, keys of
    the fields under ``managedFields`` and the spec, are escaped inside their strings and
    leave the cut alone."""
    tricky = ',"managedFields":[ ]},"spec": ]}," [{ \\" \u2603'
    data = _pod_event(
        {"lakeshore": "true"},
        {"nymph.dev/note": tricky, tricky: "x"},
        _managed({"f:metadata": {"f:labels": {"f:lakeshore": {}}}, f'k:{{"name":{json.dumps(tricky)}}}': {}}),
    )
    cut = without_managed_fields(data)
    assert cut is not None and "managedFields" not in json.loads(cut)["object"]["metadata"]
    assert json.loads(cut) == _decoded_whole(data)


@settings(max_examples=200, deadline=None)
@given(
    labels=st.dictionaries(st.text(max_size=12), st.text(max_size=20), max_size=4),
    annotations=st.dictionaries(st.text(max_size=12), st.text(max_size=40), max_size=4),
    fields=st.recursive(
        st.just({}),
        lambda inner: st.dictionaries(st.text(max_size=16).map(lambda k: "f:" + k), inner, max_size=3),
        max_leaves=10,
    ),
)
def test_the_cut_decodes_to_the_same_event_as_the_whole(
    labels: dict[str, str], annotations: dict[str, str], fields: dict[str, Any]
) -> None:
    data = _pod_event(labels, annotations, _managed(fields))
    cut = without_managed_fields(data)
    assert cut is not None
    assert json.loads(cut) == _decoded_whole(data)


def test_an_event_without_the_layout_is_decoded_whole() -> None:
    no_managed = json.dumps(EVENT, separators=(",", ":"))
    assert without_managed_fields(no_managed) is None
    # managedFields with no spec after the metadata (not a Pod as the API server writes it)
    odd = json.dumps({"type": "MODIFIED", "object": {"metadata": {"name": "x", "managedFields": []}}})
    assert without_managed_fields(odd) is None


async def test_the_watch_decodes_events_without_their_managed_fields() -> None:
    w = RawWatch()
    try:
        data = _pod_event({"a": "b"}, {}, _managed({"f:spec": {}}))
        event = w.unmarshal_event(data, w.get_return_type(None))
        assert event["object"] == _decoded_whole(data)["object"] and w.resource_version == "42"
        # Not the layout the cut relies on (an array, then "spec", inside managedFields): the
        # cut does not decode, and the event is decoded whole instead.
        odd = {
            "type": "MODIFIED",
            "object": {
                "metadata": {
                    "name": "x",
                    "resourceVersion": "43",
                    "managedFields": [{"a": {"b": [1]}, "spec": 2}],
                },
                "spec": {},
            },
        }
        text = json.dumps(odd, separators=(",", ":"))
        assert without_managed_fields(text) is not None
        assert w.unmarshal_event(text, "")["object"] == odd["object"] and w.resource_version == "43"
    finally:
        await w._api_client.close()
