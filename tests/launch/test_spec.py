from __future__ import annotations

from typing import Any

import pytest

from nymph.errors import ValidationError
from nymph.launch.config import Mode, Provider
from nymph.launch.spec import MAX_SCRIPT_BYTES, LaunchSpec, build_launch_spec

IID = "lakeshore-0123abcd"


def build(
    fields: dict[str, Any] | None = None,
    body: dict[str, Any] | None = None,
    kwargs: dict[str, Any] | None = None,
) -> LaunchSpec:
    return build_launch_spec(
        provider=Provider(name="my-cluster", kwargs=kwargs or {}),
        mode=Mode(name="m", fields={"image": "python:3.12", **(fields or {})}),
        body={"script": "print(1)\n", **(body or {})},
        instance_id=IID,
    )


@pytest.mark.parametrize("image", [None, ""])
def test_missing_or_empty_image_fails_immediately(image: object) -> None:
    with pytest.raises(ValidationError) as info:
        build({"image": image})
    assert info.value.field == "mode.image"
    assert "required" in info.value.message


def test_image_with_spaces_is_rejected() -> None:
    with pytest.raises(ValidationError, match="not an image reference"):
        build({"image": "python 3"})


def test_env_numbers_and_booleans_are_stringified_others_skipped() -> None:
    spec = build(
        {"env": {"S": "x", "I": 4, "F": 1.5, "T": True, "N": False, "L": [1], "D": {"a": 1}, "Z": None}}
    )
    assert dict(spec.env) == {"S": "x", "I": "4", "F": "1.5", "T": "true", "N": "false"}
    assert any("mode.env.L skipped" in w for w in spec.warnings)


def test_precedence_launch_fields_over_mode_and_env_merged_by_name() -> None:
    spec = build(
        {"env": {"A": "mode", "B": "mode"}},
        {"fields": {"image": "python:3.13"}, "env": {"B": "launch", "C": 1}},
    )
    assert spec.image == "python:3.13"
    assert dict(spec.env) == {"A": "mode", "B": "launch", "C": "1"}


def test_launch_cannot_change_the_connection() -> None:
    with pytest.raises(ValidationError, match="unknown key"):
        build(body={"namespace": "other"})
    with pytest.raises(ValidationError, match="unknown field"):
        build(body={"fields": {"namespace": "other"}})


def test_reserved_env_names_are_refused_by_name() -> None:
    """An env name nymph reserves (its own prefix) is an error naming it, never dropped unsaid;
    in a mode and in a launch body alike."""
    with pytest.raises(ValidationError) as info:
        build({"env": {"NYMPH_INSTANCE_ID": "x", "OK": "1"}})
    assert info.value.field == "mode.env.NYMPH_INSTANCE_ID"
    with pytest.raises(ValidationError) as info:
        build(body={"env": {"NYMPH_ANYTHING": "x"}})
    assert info.value.field == "launch.env.NYMPH_ANYTHING"
    assert dict(build({"env": {"NOT_NYMPH_X": "1"}}).env)["NOT_NYMPH_X"] == "1"


def test_namespace_defaults_and_is_validated() -> None:
    assert build().namespace == "default"
    assert build(kwargs={"namespace": "lakeshore"}).namespace == "lakeshore"
    with pytest.raises(ValidationError) as info:
        build(kwargs={"namespace": "Bad_NS"})
    assert info.value.field == "provider.namespace"


def test_resources_pass_through_verbatim_and_are_checked() -> None:
    res = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"nvidia.com/gpu": 1}}
    assert build({"resources": res}).resources == res
    with pytest.raises(ValidationError, match="unknown key"):
        build({"resources": {"limit": {"cpu": 1}}})
    with pytest.raises(ValidationError, match="not a quantity"):
        build({"resources": {"limits": {"cpu": [1]}}})


def test_pod_shape_fields() -> None:
    spec = build(
        {
            "node_selector": {"gpu": "a100", "zone": 3},
            "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "service_account": "trainer",
            "image_pull_secrets": ["regcred", {"name": "other"}],
        }
    )
    assert spec.node_selector == (("gpu", "a100"), ("zone", "3"))
    assert spec.tolerations[0]["key"] == "gpu"
    assert spec.service_account == "trainer"
    assert spec.image_pull_secrets == ("regcred", "other")


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"node_selector": {"bad key": "x"}}, "mode.node_selector.bad key"),
        ({"tolerations": "gpu"}, "mode.tolerations"),
        ({"service_account": "Not_Valid"}, "mode.service_account"),
        ({"image_pull_secrets": [""]}, "mode.image_pull_secrets[0]"),
        ({"env": ["A=1"]}, "mode.env"),
    ],
)
def test_bad_fields_name_the_field(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        build(fields)
    assert info.value.field == field


@pytest.mark.parametrize(
    ("script", "message"),
    [("", "required"), ("   \n", "required"), ("a\x00b", "NUL"), ("x" * (MAX_SCRIPT_BYTES + 1), "limit")],
)
def test_script_checks(script: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        build(body={"script": script})


def test_spec_round_trips_through_json() -> None:
    spec = build({"env": {"A": 1}, "node_selector": {"g": "x"}}, {"tags": {"team": "ml"}})
    again = LaunchSpec.from_json(spec.to_json())
    assert again == spec


def test_malformed_spec_json_is_a_validation_error() -> None:
    with pytest.raises(ValidationError, match="malformed launch spec"):
        LaunchSpec.from_json({"instanceId": IID})


def test_check_depth_counts_levels_without_recursion() -> None:
    from nymph.launch.specids import MAX_DEPTH, check_depth

    check_depth("x", "f")
    value: object = "x"
    for _ in range(MAX_DEPTH):
        value = [value]
    check_depth(value, "f")  # exactly at the limit
    with pytest.raises(ValidationError) as err:
        check_depth([value], "mode.tolerations")
    assert err.value.field == "mode.tolerations" and str(MAX_DEPTH) in err.value.message
    deep: object = {}
    for _ in range(100_000):  # far beyond the interpreter's recursion limit
        deep = {"a": deep}
    with pytest.raises(ValidationError):
        check_depth(deep, "launch.tags")
