"""The checks of a launch spec's bookkeeping fields (pure): how deep a value nests, the launch
uid, the group id and index a group's members carry, and the retry policy (checked by
:mod:`nymph.launch.retry`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nymph.errors import ValidationError
from nymph.launch import names
from nymph.launch.retry import parse_policy

#: How deeply a mode field or launch value (resources, tolerations, env, tags, ...) may nest
#: lists and mappings; the Pod fields nymph renders need a handful of levels.
MAX_DEPTH = 32


def check_depth(value: object, fld: str, *, limit: int = MAX_DEPTH) -> None:
    """Refuse ``value`` if its lists and mappings nest deeper than ``limit`` (iterative, so any
    depth is measured without recursion). A scalar has depth 0, ``[1]`` depth 1."""
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        if depth + 1 > limit:
            raise ValidationError(fld, f"is nested deeper than {limit} levels of lists and mappings")
        stack.extend((child, depth + 1) for child in children)


def check_launch_uid(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not names.is_label_value(value) or not value:
        raise ValidationError("spec.launchUid", f"{value!r} is not a launch uid")
    return value


def check_retry(value: object, fld: str) -> Mapping[str, Any] | None:
    check_depth(value, fld, limit=4)
    if parse_policy(value, fld) is None:
        return None
    assert isinstance(value, Mapping)
    return value


def check_group_id(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or not names.is_label_value(value):
        raise ValidationError("spec.groupId", f"{value!r} is not a group id")
    return value


def check_group_index(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValidationError("spec.groupIndex", f"{value!r} is not a group index")
    return value
