"""A namespace's scheduling settings as the API takes and answers them (pure).

``PUT /v1/namespaces/:ns/quota`` takes ``{"weight": 2, "maxRunning": 50, "resources": {"cpu":
"64", "memory": "256Gi", "nvidia.com/gpu": "8"}, "maxRuntime": 86400, "defaultRuntime": 3600}``:
every key optional (a key left out keeps its setting), ``null`` removes a limit (the weight goes
back to 1), durations in seconds or as ``90s``, ``30m``, ``2h``, ``1d``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from fractions import Fraction
from typing import Any

from nymph.errors import ValidationError
from nymph.launch.durations import format_duration, parse_duration
from nymph.launch.placement import QuantityError, format_quantity, parse_quantity
from nymph.queue.scheduling import Quota, Usage

KEYS = ("weight", "maxRunning", "resources", "maxRuntime", "defaultRuntime")
MAX_WEIGHT = 1000
MAX_RUNNING = 1_000_000
MAX_RESOURCES = 32


def _weight(value: object) -> Fraction:
    if value is None:
        return Fraction(1)
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValidationError("quota.weight", f"{value!r} is not a number; use e.g. 1, 2 or 0.5")
    try:
        weight = Fraction(str(value))
    except (ValueError, ZeroDivisionError):
        raise ValidationError("quota.weight", f"{value!r} is not a number; use e.g. 1, 2 or 0.5") from None
    if not 0 < weight <= MAX_WEIGHT:
        raise ValidationError(
            "quota.weight", f"{value!r} is out of range: use more than 0, at most {MAX_WEIGHT}"
        )
    return weight


def _count(value: object, fld: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_RUNNING:
        raise ValidationError(fld, f"{value!r} is not a whole number from 0 to {MAX_RUNNING}")
    return value


def _resources(value: object) -> dict[str, Fraction]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValidationError(
            "quota.resources", 'must be a mapping of resource to quantity, e.g. {"cpu": "64"}'
        )
    if len(value) > MAX_RESOURCES:
        raise ValidationError("quota.resources", f"at most {MAX_RESOURCES} resources")
    out: dict[str, Fraction] = {}
    for name, amount in value.items():
        fld = f"quota.resources.{name}"
        if not isinstance(name, str) or not 0 < len(name) <= 253 or not name.isprintable():
            raise ValidationError("quota.resources", f"{name!r} is not a resource name")
        if amount is None:
            continue
        try:
            quantity = parse_quantity(amount)
        except QuantityError as exc:
            raise ValidationError(fld, str(exc)) from None
        if quantity < 0:
            raise ValidationError(fld, f"{amount!r} is negative")
        out[name] = quantity
    return out


def _duration(value: object, fld: str) -> int | None:
    return None if value is None else parse_duration(value, fld)


def merge(current: Quota, body: object) -> Quota:
    """The settings after a PUT of ``body`` over ``current``; ValidationError naming the key."""
    if not isinstance(body, Mapping):
        raise ValidationError("quota", f"the body must be a JSON object with any of {', '.join(KEYS)}")
    unknown = sorted(str(k) for k in body if k not in KEYS)
    if unknown:
        raise ValidationError(f"quota.{unknown[0]}", f"unknown key; a quota takes {', '.join(KEYS)}")
    out = current
    if "weight" in body:
        out = replace(out, weight=_weight(body["weight"]))
    if "maxRunning" in body:
        out = replace(out, max_running=_count(body["maxRunning"], "quota.maxRunning"))
    if "resources" in body:
        out = replace(out, resources=_resources(body["resources"]))
    if "maxRuntime" in body:
        out = replace(out, max_runtime=_duration(body["maxRuntime"], "quota.maxRuntime"))
    if "defaultRuntime" in body:
        out = replace(out, default_runtime=_duration(body["defaultRuntime"], "quota.defaultRuntime"))
    if (
        out.max_runtime is not None
        and out.default_runtime is not None
        and out.default_runtime > out.max_runtime
    ):
        raise ValidationError(
            "quota.defaultRuntime",
            f"{format_duration(out.default_runtime)} is more than maxRuntime {format_duration(out.max_runtime)}",
        )
    return out


def weight_json(weight: Fraction) -> int | float:
    return int(weight) if weight.denominator == 1 else float(weight)


def quota_json(namespace: str, quota: Quota, usage: Usage) -> dict[str, Any]:
    """The answer of ``GET .../quota``: the settings and what the namespace holds now."""
    return {
        "namespace": namespace,
        "weight": weight_json(quota.weight),
        "maxRunning": quota.max_running,
        "resources": {k: format_quantity(v, resource=k) for k, v in sorted(quota.resources.items())},
        "maxRuntime": quota.max_runtime,
        "defaultRuntime": quota.default_runtime,
        "usage": {
            "running": usage.running,
            "resources": {k: format_quantity(v, resource=k) for k, v in sorted(usage.requests.items()) if v},
        },
    }
