"""JSON whose integers fit in 64 bits (the API server's, as Kubernetes' types are) decodes to
exactly what the standard library gives, whichever decoder takes it, and what is not JSON is
refused the same way; what is encoded, as bytes or text, reads back as the standard library's
encoding does."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nymph import fastjson

DOCUMENTS = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=30,
)


@given(DOCUMENTS)
def test_any_document_decodes_as_the_standard_library_decodes_it(doc: Any) -> None:
    text = json.dumps(doc)
    assert fastjson.loads(text) == json.loads(text)
    assert fastjson.loads(text.encode()) == json.loads(text)


@pytest.mark.parametrize(
    "text",
    [
        '"\\ud800"',  # a lone surrogate escape
        '{"a": 1, "a": 2}',  # a repeated key: the last one wins
    ],
)
def test_what_orjson_refuses_or_reads_its_own_way_still_decodes_as_json_does(text: str) -> None:
    assert fastjson.loads(text) == json.loads(text)


@pytest.mark.parametrize("text", ["", "{", "not json", b"\xff\xfe", "[1,]"])
def test_what_is_not_json_is_refused_with_a_value_error(text: str | bytes) -> None:
    with pytest.raises(ValueError):
        fastjson.loads(text)


@pytest.mark.parametrize(
    "obj",
    [
        {
            "metadata": {"name": "p", "annotations": {"n": "caf\u00e9 \u2713"}},
            "spec": {"x": [1, 2.5, None, True]},
        },
        {"big": 2**70},  # past 64 bits: orjson refuses, the standard library encodes it
        {1: "a key that is not a string"},
    ],
)
def test_what_is_encoded_decodes_to_what_the_standard_library_makes_of_it(obj: Any) -> None:
    assert json.loads(fastjson.dumps(obj)) == json.loads(json.dumps(obj))
    assert json.loads(fastjson.dumps_text(obj)) == json.loads(json.dumps(obj))


@given(DOCUMENTS)
def test_any_document_encoded_as_text_reads_back_as_itself(doc: Any) -> None:
    assert json.loads(fastjson.dumps_text(doc)) == doc


CANON_DOCUMENTS = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=8), inner, max_size=6)
    ),
    max_leaves=40,
)


def _reference(doc: Any) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


@given(CANON_DOCUMENTS)
def test_the_canonical_form_is_byte_for_byte_the_standard_librarys(doc: Any) -> None:
    """What hash chains were taken of (the audit log's) can never change: any mix of text
    (control characters, non-ASCII, astral), integers past 64 bits, floats, nesting and key
    order encodes to exactly the bytes the standard library's sorted, compact form gives."""
    try:
        expected = _reference(doc)
    except UnicodeEncodeError:  # a lone surrogate: refused alike
        with pytest.raises(UnicodeEncodeError):
            fastjson.canonical(doc)
        return
    assert fastjson.canonical(doc) == expected


def test_the_canonical_form_of_an_audit_like_record_is_the_standard_librarys() -> None:
    record = {
        "seq": 12,
        "ts": "2026-12-06T23:00:00.123+00:00",
        "action": "apply",
        "instance": "lakeshore-0001",
        "requester": "caf\u00e9 \u2028 \U0001f600 \x00\x1f\x7f",
        "manifest_sha256": "ab" * 32,
        "ok": True,
        "error": None,
        "big": 2**64 - 1,
        "prev": "0" * 64,
        "\u00e9": 1,
        "z": 2,
        "E": 3,
    }
    assert fastjson.canonical(record) == _reference(record)
    # a float takes the standard library's path (orjson writes 1e-5 where it writes 1e-05)
    assert fastjson.canonical({"x": 1e-05}) == b'{"x":1e-05}'
