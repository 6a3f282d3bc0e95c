"""Launch groups: one body that stands for many launches (pure).

A group body is either ``{"mode", "script", "count": N}`` (N copies of one launch) or
``{"items": [{...launch body...}, ...]}``, where the group's own ``mode``, ``script``, ``tags``,
``env``, ``fields`` and ``priority`` are every item's defaults: an item's ``tags``, ``env`` and
``fields`` are merged over the group's key by key, its other keys replace the group's.
:func:`expand` turns it into the launch bodies in order (an item's place is its
``NYMPH_GROUP_INDEX``); every error names the key (``items[3].env``).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

from nymph.errors import ValidationError

#: The most launches one group holds.
MAX_GROUP_SIZE = 10_000
#: What a group body may say besides ``count`` / ``items``: each item's defaults.
SHARED_KEYS = ("mode", "script", "tags", "env", "fields", "priority")
#: Item keys merged over the group's key by key (the others replace the group's).
MERGED_KEYS = frozenset({"tags", "env", "fields"})
GROUP_PREFIX = "group-"


def new_group_id() -> str:
    """A fresh group id, ``group-<12 hex>`` (a valid label value)."""
    return GROUP_PREFIX + secrets.token_hex(6)


def is_group_id(value: str) -> bool:
    rest = value.removeprefix(GROUP_PREFIX)
    return value.startswith(GROUP_PREFIX) and len(rest) == 12 and all(c in "0123456789abcdef" for c in rest)


def expand(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The launch bodies a group body stands for, in order (at least one, at most
    :data:`MAX_GROUP_SIZE`); a :class:`ValidationError` names what is wrong."""
    allowed = {*SHARED_KEYS, "count", "items"}
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise ValidationError(unknown[0], f"is not a key of a launch group; use {', '.join(sorted(allowed))}")
    has_count, has_items = body.get("count") is not None, body.get("items") is not None
    if has_count == has_items:
        raise ValidationError(
            "count", "give exactly one of count (N copies of one launch) or items (a list of launches)"
        )
    shared = {k: body[k] for k in SHARED_KEYS if body.get(k) is not None}
    for key in MERGED_KEYS & set(shared):
        if not isinstance(shared[key], Mapping):
            raise ValidationError(key, "must be a JSON object")
    if has_count:
        count = body["count"]
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_GROUP_SIZE:
            raise ValidationError("count", f"must be a whole number from 1 to {MAX_GROUP_SIZE}")
        _require_mode(shared, "mode")
        return [dict(shared) for _ in range(count)]
    items = body["items"]
    if not isinstance(items, list) or not items:
        raise ValidationError("items", "must be a non-empty list of launch bodies (JSON objects)")
    if len(items) > MAX_GROUP_SIZE:
        raise ValidationError("items", f"has {len(items)} launches; a group holds at most {MAX_GROUP_SIZE}")
    out = []
    for i, item in enumerate(items):
        where = f"items[{i}]"
        if not isinstance(item, Mapping):
            raise ValidationError(where, "must be a JSON object (a launch body)")
        bad = sorted(set(item) - set(SHARED_KEYS))
        if bad:
            raise ValidationError(
                f"{where}.{bad[0]}", f"is not a key of a launch; use {', '.join(SHARED_KEYS)}"
            )
        merged = dict(shared)
        for key, value in item.items():
            if value is None:
                continue
            if key in MERGED_KEYS:
                if not isinstance(value, Mapping):
                    raise ValidationError(f"{where}.{key}", "must be a JSON object")
                merged[key] = {**merged.get(key, {}), **value}
            else:
                merged[key] = value
        _require_mode(merged, f"{where}.mode")
        out.append(merged)
    return out


def _require_mode(body: Mapping[str, Any], where: str) -> None:
    mode = body.get("mode")
    if not isinstance(mode, str) or not mode.strip():
        raise ValidationError(where, "is required: the mode every launch of the group runs with")
