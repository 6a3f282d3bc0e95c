"""A launch's ``priority`` and ``max_runtime``, and a namespace's runtime limits (pure).

* ``priority``: an integer in ``PRIORITY_MIN..PRIORITY_MAX`` (default 0); within a namespace
  the scheduler runs higher first. A mode field, overridden per launch by the launch body's
  top-level ``priority``.
* ``max_runtime``: a duration (:mod:`nymph.launch.durations`); the Pod's
  ``spec.activeDeadlineSeconds``, after which the Pod ends ``stopped`` with reason
  ``DeadlineExceeded``. A mode field, overridden per launch by ``fields.max_runtime``.

:func:`apply_runtime_limits` is what the queue applies when it accepts a launch into a namespace
with quotas: a namespace's ``defaultRuntime`` fills in a launch that names no ``max_runtime``, and
its ``maxRuntime`` refuses one that asks for more.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from nymph.errors import ValidationError
from nymph.launch.durations import format_duration, parse_duration
from nymph.launch.retry import parse_policy

if TYPE_CHECKING:  # spec.py imports this module's checks
    from nymph.launch.spec import LaunchSpec

PRIORITY_MIN = -1000
PRIORITY_MAX = 1000
DEFAULT_PRIORITY = 0
#: Where a launch's ``max_runtime`` is named in an error about it (it is set through ``fields``).
MAX_RUNTIME_FIELD = "launch.fields.max_runtime"


def check_priority(value: object, field: str) -> int:
    """``value`` as a priority; :class:`ValidationError` naming ``field`` for anything but an
    integer in range (a bool, a float and a string are refused, ``"10"`` too)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(
            field, f"{value!r} is not an integer; use a whole number from {PRIORITY_MIN} to {PRIORITY_MAX}"
        )
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise ValidationError(
            field, f"{value} is out of range; use a whole number from {PRIORITY_MIN} to {PRIORITY_MAX}"
        )
    return value


def check_settings(kwargs: Mapping[str, Any], *, where: str) -> None:
    """Refuse a mode's (or provider's) ``priority`` or ``max_runtime`` that no launch could use,
    naming the field as ``<where>.priority``; absent or null values are fine."""
    if kwargs.get("priority") is not None:
        check_priority(kwargs["priority"], f"{where}.priority")
    if kwargs.get("max_runtime") is not None:
        parse_duration(kwargs["max_runtime"], f"{where}.max_runtime")
    if kwargs.get("image_pull_timeout") is not None:
        parse_duration(kwargs["image_pull_timeout"], f"{where}.image_pull_timeout")
    if kwargs.get("retry") is not None:
        parse_policy(kwargs["retry"], f"{where}.retry")


def apply_runtime_limits(spec: LaunchSpec, *, default: int | None, cap: int | None) -> LaunchSpec:
    """``spec`` under a namespace's runtime limits (seconds; None for no limit).

    A spec without ``max_runtime`` gets ``default``; one with a ``max_runtime`` above ``cap``
    is refused with a :class:`ValidationError` naming ``launch.fields.max_runtime`` and the cap.
    A ``default`` above ``cap`` is held to the cap (the cap is the namespace's promise).
    """
    if spec.max_runtime is None:
        if default is None:
            return spec
        wanted = default if cap is None else min(default, cap)
        return dataclasses.replace(spec, max_runtime=wanted)
    if cap is not None and spec.max_runtime > cap:
        raise ValidationError(
            MAX_RUNTIME_FIELD,
            f"{format_duration(spec.max_runtime)} is more than this namespace's maxRuntime "
            f"{format_duration(cap)}; ask for at most {format_duration(cap)}",
        )
    return spec
