"""Durations as launch settings take them (pure): ``max_runtime`` on a mode or a launch, and a
namespace's ``maxRuntime`` / ``defaultRuntime``.

A duration is a positive whole number of seconds, given as an integer (``5400``) or a string:
a bare integer (``"5400"``) or one with a unit, ``s``, ``m``, ``h`` or ``d`` (``"90s"``,
``"30m"``, ``"2h"``, ``"1d"``). It is at most :data:`MAX_DURATION_SECONDS` (365 days).
:func:`format_duration` writes seconds back in the largest unit that divides them, so
``parse_duration(format_duration(s), ...) == s`` for every valid ``s``.
"""

from __future__ import annotations

import re

from nymph.errors import ValidationError

#: Seconds per unit, largest first (the order :func:`format_duration` tries them in).
UNITS: tuple[tuple[str, int], ...] = (("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1))
#: The longest duration accepted: a year.
MAX_DURATION_SECONDS = 365 * 86_400
#: What an error shows as the accepted forms.
ACCEPTED_FORMS = "a positive number of seconds (5400) or a string like '90s', '30m', '2h', '1d'"

_UNIT_SECONDS = dict(UNITS)
# Digits then an optional unit; at most 12 digits so a huge number is refused before int().
_DURATION_RE = re.compile(r"([0-9]{1,12})([smhd]?)")


def parse_duration(value: object, field: str) -> int:
    """``value`` as whole seconds; :class:`ValidationError` naming ``field`` (and the accepted
    forms) for anything else: a bool, a float, zero, a negative number, an unknown unit, a
    duration longer than :data:`MAX_DURATION_SECONDS`."""
    if isinstance(value, bool):
        raise ValidationError(field, f"{value!r} is not a duration; use {ACCEPTED_FORMS}")
    if isinstance(value, int):
        seconds = value
    elif isinstance(value, str):
        match = _DURATION_RE.fullmatch(value.strip())
        if match is None:
            raise ValidationError(field, f"{value!r} is not a duration; use {ACCEPTED_FORMS}")
        seconds = int(match.group(1)) * _UNIT_SECONDS.get(match.group(2) or "s", 1)
    else:
        raise ValidationError(field, f"{value!r} is not a duration; use {ACCEPTED_FORMS}")
    if seconds <= 0:
        raise ValidationError(field, f"{value!r} is not positive; use {ACCEPTED_FORMS}")
    if seconds > MAX_DURATION_SECONDS:
        raise ValidationError(
            field, f"{value!r} is longer than {format_duration(MAX_DURATION_SECONDS)}, the longest allowed"
        )
    return seconds


def format_duration(seconds: int) -> str:
    """``seconds`` in the largest unit that divides it exactly: 7200 -> ``"2h"``, 90 ->
    ``"90s"``, 5400 -> ``"90m"``."""
    if seconds <= 0:
        return f"{seconds}s"
    for unit, size in UNITS:
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"  # unreachable: every whole number is a whole number of seconds
