"""The duration grammar of ``max_runtime`` (and of a namespace's runtime limits), on plain data."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nymph.errors import ValidationError
from nymph.launch.durations import MAX_DURATION_SECONDS, format_duration, parse_duration


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (90, 90),
        ("90", 90),
        ("90s", 90),
        ("30m", 1800),
        ("2h", 7200),
        ("1d", 86_400),
        (" 2h ", 7200),
        ("365d", MAX_DURATION_SECONDS),
        (MAX_DURATION_SECONDS, MAX_DURATION_SECONDS),
        (1, 1),
    ],
)
def test_accepted_forms(value: object, seconds: int) -> None:
    assert parse_duration(value, "mode.max_runtime") == seconds


@pytest.mark.parametrize(
    "value",
    [
        0,
        -5,
        "0",
        "0s",
        "-5m",
        "1.5h",
        1.5,
        90.0,
        True,
        False,
        None,
        "",
        "h",
        "2H",
        "2 h",
        "2hours",
        "1h30m",
        "1w",
        "PT2H",
        "1e3",
        [90],
        {"s": 90},
        "366d",
        MAX_DURATION_SECONDS + 1,
        "9" * 13,
        10**30,
    ],
)
def test_everything_else_is_refused_naming_the_field(value: object) -> None:
    with pytest.raises(ValidationError) as err:
        parse_duration(value, "launch.fields.max_runtime")
    assert err.value.field == "launch.fields.max_runtime"
    assert str(err.value).startswith("launch.fields.max_runtime: ")


def test_the_error_shows_the_accepted_forms() -> None:
    with pytest.raises(ValidationError, match=r"'90s', '30m', '2h', '1d'"):
        parse_duration("soon", "mode.max_runtime")
    with pytest.raises(ValidationError, match=r"longer than 365d"):
        parse_duration("400d", "mode.max_runtime")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(90, "90s"), (60, "1m"), (5400, "90m"), (7200, "2h"), (86_400, "1d"), (90_000, "25h"), (61, "61s")],
)
def test_format_uses_the_largest_unit_that_divides(seconds: int, text: str) -> None:
    assert format_duration(seconds) == text


@given(st.integers(min_value=1, max_value=MAX_DURATION_SECONDS))
def test_parse_of_format_is_the_identity(seconds: int) -> None:
    assert parse_duration(format_duration(seconds), "f") == seconds
    assert parse_duration(seconds, "f") == seconds
    assert parse_duration(str(seconds), "f") == seconds


@given(st.integers(min_value=1, max_value=365), st.sampled_from(["s", "m", "h", "d"]))
def test_format_of_parse_is_canonical(n: int, unit: str) -> None:
    seconds = parse_duration(f"{n}{unit}", "f")
    assert parse_duration(format_duration(seconds), "f") == seconds
    assert len(format_duration(seconds)) <= len(f"{n}{unit}")


@given(st.text(max_size=12))
def test_any_text_parses_or_is_a_validation_error(text: str) -> None:
    try:
        seconds = parse_duration(text, "f")
    except ValidationError as exc:
        assert exc.field == "f"
    else:
        assert 1 <= seconds <= MAX_DURATION_SECONDS
