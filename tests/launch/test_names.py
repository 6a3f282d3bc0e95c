from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nymph.errors import ValidationError
from nymph.launch import names


def test_instance_ids_have_the_contract_shape_and_are_unique() -> None:
    ids = {names.new_instance_id() for _ in range(2000)}
    assert len(ids) == 2000
    assert all(re.fullmatch(r"lakeshore-[0-9a-f]{8}", i) for i in ids)


@pytest.mark.parametrize(
    "bad", ["lakeshore-123", "lakeshore-0123ABCD", "nymph-01234567", "lakeshore-01234567x", ""]
)
def test_bad_instance_ids_are_rejected(bad: str) -> None:
    with pytest.raises(ValidationError, match="not an instance id"):
        names.check_instance_id(bad)


@pytest.mark.parametrize(
    ("name", "slug"),
    [
        ("my-cluster", "my-cluster"),
        ("My Cluster!", "my-cluster"),
        ("__x__", "x"),
        ("!!!", "provider"),
        ("a" * 80, "a" * 63),
        ("GPU.pool_1", "gpu.pool_1"),
    ],
)
def test_slugify(name: str, slug: str) -> None:
    assert names.slugify(name) == slug


@given(st.text())
def test_any_provider_name_slugs_to_a_valid_label_value(name: str) -> None:
    slug = names.slugify(name)
    assert slug and names.is_label_value(slug)


def test_selector_labels_are_exactly_the_three_reserved_keys() -> None:
    labels = names.selector_labels(owner_namespace="default", provider="My Cluster")
    assert labels == {
        "lakeshore": "true",
        "lakeshore.namespace": "default",
        "lakeshore.provider": "my-cluster",
    }
    assert set(labels) == names.RESERVED_LABEL_KEYS
    assert (
        names.label_selector(labels)
        == "lakeshore=true,lakeshore.namespace=default,lakeshore.provider=my-cluster"
    )


def test_reserved_tags_are_dropped_others_kept() -> None:
    labels, dropped = names.tags_to_labels(
        {
            "lakeshore": "x",
            "lakeshore.provider": "evil",
            "lakeshore.namespace": "y",
            "team": "ml",
            "example.com/tier": 1,
            "ok": True,
        }
    )
    assert labels == {"team": "ml", "example.com/tier": "1", "ok": "true"}
    assert sorted(dropped) == ["lakeshore", "lakeshore.namespace", "lakeshore.provider"]


@pytest.mark.parametrize(
    ("tags", "field"),
    [
        ({"bad key": "v"}, "tags.bad key"),
        ({"-lead": "v"}, "tags.-lead"),
        ({"a" * 64: "v"}, "tags." + "a" * 64),
        ({"UPPER.example.com/x": "v"}, "tags.UPPER.example.com/x"),
        ({"/x": "v"}, "tags./x"),
        ({"team": "has space"}, "tags.team"),
        ({"team": "x" * 64}, "tags.team"),
        ({"team": {"nested": 1}}, "tags.team"),
        ({"team": "trailing-"}, "tags.team"),
    ],
)
def test_invalid_tags_are_rejected_naming_the_tag(tags: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        names.tags_to_labels(tags)
    assert info.value.field == field


def test_tags_must_be_a_mapping() -> None:
    with pytest.raises(ValidationError, match="must be a mapping"):
        names.tags_to_labels(["a=b"])


LABEL_KEY = re.compile(
    r"^(([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")

tag_keys = st.one_of(
    st.text(max_size=80),
    st.from_regex(r"[a-z]{1,10}(\.[a-z]{1,5})?/[A-Za-z][-A-Za-z0-9_.]{0,20}", fullmatch=True),
)
tag_values = st.one_of(
    st.text(max_size=80),
    st.integers(),
    st.booleans(),
    st.floats(allow_nan=False),
    st.none(),
    st.from_regex(r"[A-Za-z0-9]{1,20}", fullmatch=True),
)


@given(st.dictionaries(tag_keys, tag_values, max_size=8))
def test_any_tag_map_yields_only_valid_labels_or_a_clear_error(tags: dict[str, object]) -> None:
    try:
        labels, dropped = names.tags_to_labels(tags)
    except ValidationError as exc:
        assert exc.field.startswith("tags.")
        return
    for k, v in labels.items():
        assert k not in names.RESERVED_LABEL_KEYS
        prefix, _, name = k.rpartition("/")
        assert LABEL_KEY.match(k) and len(name) <= 63 and len(prefix) <= 253, k
        assert LABEL_VALUE.match(v) and len(v) <= 63, v
    assert set(dropped) <= names.RESERVED_LABEL_KEYS
