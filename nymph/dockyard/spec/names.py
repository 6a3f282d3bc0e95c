"""Kubernetes name and label rules, as problem lists for the schema."""

from __future__ import annotations

import re
from collections.abc import Mapping

from nymph.launch.names import is_label_key, is_label_value

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")

Problems = list[tuple[str, str]]


def dns1123_label(value: str, *, key: str) -> Problems:
    """Namespaces: lower-case alphanumerics and '-', at most 63 characters."""
    if len(value) > 63 or not _DNS1123_LABEL.match(value):
        return [(key, f"{value!r} is not a DNS label (a-z, 0-9, '-', at most 63 characters)")]
    return []


def dns1035_label(value: str, *, key: str) -> Problems:
    """Service and RayCluster names: a DNS label that starts with a letter."""
    if len(value) > 63 or not _DNS1035_LABEL.match(value):
        return [
            (key, f"{value!r} is not a DNS-1035 label (a-z first, then a-z, 0-9, '-'; at most 63 characters)")
        ]
    return []


def label_map(labels: Mapping[str, str], *, key: str) -> Problems:
    out: Problems = []
    for k, v in labels.items():
        if not is_label_key(k):
            out.append((key, f"{k!r} is not a valid label key ([prefix/]name, name at most 63)"))
        elif not is_label_value(v):
            out.append(
                (
                    f"{key}.{k}",
                    f"{v!r} is not a valid label value (at most 63 of "
                    "A-Z a-z 0-9 - _ . , starting and ending alphanumeric)",
                )
            )
    return out
