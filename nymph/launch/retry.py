"""Retry policies: when a launch that ended is launched again, as a new attempt (pure).

A policy is the ``retry`` field of a mode (or of a launch's ``fields``)::

    {"limit": 3, "on": ["OOMKilled", "Evicted", "NodeLost", "exit:137", "exit:1-5"],
     "backoff": "10s", "maxBackoff": "5m", "memoryFactor": 2, "avoidNode": true}

``limit`` is how many retries (attempts after the first) at most; ``on`` the reasons (from the
closed list of :class:`~nymph.launch.state.Reason`, ``Completed`` and ``Stopped`` aside) and
exit codes (``exit:N``, ``exit:N-M``) that are retried; without ``on``, every failure but the
configuration errors (:data:`NAMED_ONLY`: ``ImagePull``, ``CreateContainerError``,
``LaunchFailed``), which are retried only when named. The n-th retry waits
``backoff * 2**(n-1)``, at most ``maxBackoff``. ``memoryFactor`` multiplies the memory request
and limit after ``OOMKilled``; ``avoidNode`` keeps the next attempt off the node after
``Evicted`` or ``NodeLost``. :func:`decide` says what one ended attempt gets, and why.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nymph.errors import ValidationError
from nymph.launch.durations import parse_duration
from nymph.launch.state import Reason

#: Failures retried only when ``on`` names them: a configuration error retried forever helps
#: nobody.
NAMED_ONLY = frozenset({Reason.IMAGE_PULL.value, Reason.CREATE_CONTAINER.value, Reason.LAUNCH_FAILED.value})
#: Reasons ``on`` may name (an ending that is not a failure is never retried).
RETRY_REASONS = frozenset(r.value for r in Reason if r.failed)
DEFAULT_ON = tuple(sorted(RETRY_REASONS - NAMED_ONLY))
MAX_LIMIT = 100
MAX_MEMORY_FACTOR = 16.0
DEFAULT_BACKOFF = 10
DEFAULT_MAX_BACKOFF = 300
_KEYS = ("limit", "on", "backoff", "maxBackoff", "memoryFactor", "avoidNode")
_EXIT = re.compile(r"^exit:([0-9]{1,3})(?:-([0-9]{1,3}))?$")


@dataclass(frozen=True)
class RetryPolicy:
    limit: int
    reasons: frozenset[str]
    exit_codes: tuple[tuple[int, int], ...]
    backoff: int = DEFAULT_BACKOFF
    max_backoff: int = DEFAULT_MAX_BACKOFF
    memory_factor: float | None = None
    avoid_node: bool = False


def parse_policy(value: object, fld: str) -> RetryPolicy | None:
    """The policy ``value`` describes (None for none); a :class:`ValidationError` names the bad
    part (``mode.retry.on[2]``)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValidationError(fld, 'must be a mapping like {"limit": 3, "on": ["Evicted", "exit:137"]}')
    unknown = sorted(set(value) - set(_KEYS))
    if unknown:
        raise ValidationError(f"{fld}.{unknown[0]}", f"is not a retry setting; use {', '.join(_KEYS)}")
    limit = value.get("limit")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit <= MAX_LIMIT:
        raise ValidationError(f"{fld}.limit", f"is required: how many retries at most, 0 to {MAX_LIMIT}")
    on = value.get("on", list(DEFAULT_ON))
    if not isinstance(on, list) or not on:
        raise ValidationError(f"{fld}.on", "must be a non-empty list of reasons and exit codes")
    reasons: set[str] = set()
    codes: list[tuple[int, int]] = []
    for i, rule in enumerate(on):
        where = f"{fld}.on[{i}]"
        if not isinstance(rule, str):
            raise ValidationError(where, f"{rule!r} is not a reason or an exit code (exit:137, exit:1-5)")
        m = _EXIT.match(rule)
        if m:
            low, high = int(m.group(1)), int(m.group(2) or m.group(1))
            if not 0 <= low <= high <= 255:
                raise ValidationError(where, f"{rule!r}: exit codes go from 0 to 255, the low one first")
            codes.append((low, high))
        elif rule in RETRY_REASONS:
            reasons.add(rule)
        else:
            raise ValidationError(
                where,
                f"{rule!r} is not a failure reason or an exit code; use one of "
                f"{', '.join(sorted(RETRY_REASONS))}, or exit:N / exit:N-M",
            )
    backoff = _duration(value.get("backoff"), f"{fld}.backoff", DEFAULT_BACKOFF, allow_zero=True)
    max_backoff = _duration(
        value.get("maxBackoff"), f"{fld}.maxBackoff", DEFAULT_MAX_BACKOFF, allow_zero=True
    )
    factor = value.get("memoryFactor")
    if factor is not None and (
        isinstance(factor, bool)
        or not isinstance(factor, (int, float))
        or not 1 < factor <= MAX_MEMORY_FACTOR
    ):
        raise ValidationError(
            f"{fld}.memoryFactor", f"must be a number above 1 and at most {MAX_MEMORY_FACTOR:g}"
        )
    avoid = value.get("avoidNode", False)
    if not isinstance(avoid, bool):
        raise ValidationError(f"{fld}.avoidNode", "must be true or false")
    return RetryPolicy(
        limit=limit,
        reasons=frozenset(reasons),
        exit_codes=tuple(codes),
        backoff=backoff,
        max_backoff=max(max_backoff, 0),
        memory_factor=None if factor is None else float(factor),
        avoid_node=avoid,
    )


def _duration(value: object, fld: str, default: int, *, allow_zero: bool) -> int:
    if value is None:
        return default
    if allow_zero and value in (0, "0", "0s"):
        return 0
    return parse_duration(value, fld)


@dataclass(frozen=True)
class Decision:
    """What an ended attempt gets: ``retry`` or not, the rule that matched (or why none did),
    the delay before the next attempt, and the adjustments to make to it."""

    retry: bool
    why: str
    delay: int = 0
    memory_factor: float | None = None
    avoid_node: bool = False


def decide(policy: RetryPolicy, *, attempt: int, reason: str | None, exit_code: int | None) -> Decision:
    """Whether attempt ``attempt`` (1 for the first), ended with ``reason`` and ``exit_code``,
    is retried under ``policy``."""
    if reason is None or reason not in RETRY_REASONS:
        return Decision(retry=False, why=f"not retried: it ended {reason or 'without a reason'}")
    rule = None
    if reason in policy.reasons:
        rule = reason
    elif exit_code is not None:
        rule = next(
            (
                f"exit:{lo}" if lo == hi else f"exit:{lo}-{hi}"
                for lo, hi in policy.exit_codes
                if lo <= exit_code <= hi
            ),
            None,
        )
    if rule is None:
        named = "" if reason not in NAMED_ONLY else " (configuration errors are retried only when named)"
        code = "" if exit_code is None else f" or exit code {exit_code}"
        return Decision(retry=False, why=f"not retried: no retry rule names {reason}{code}{named}")
    if attempt > policy.limit:
        return Decision(
            retry=False,
            why=f"not retried: rule {rule} matched but the limit of {policy.limit} retries is reached",
        )
    delay = min(policy.backoff * 2 ** (attempt - 1), policy.max_backoff) if policy.backoff else 0
    return Decision(
        retry=True,
        why=f"rule {rule} matched",
        delay=delay,
        memory_factor=policy.memory_factor if reason == Reason.OOM_KILLED.value else None,
        avoid_node=policy.avoid_node and reason in (Reason.EVICTED.value, Reason.NODE_LOST.value),
    )


def scale_memory(
    resources: Mapping[str, Any] | None, factor: float, *, cap: int | None
) -> dict[str, Any] | None:
    """``resources`` with the memory request and limit multiplied by ``factor`` (each at most
    ``cap`` bytes when given); None when it has no memory to scale."""
    if not resources:
        return None
    out = {k: dict(v) if isinstance(v, Mapping) else v for k, v in resources.items()}
    changed = False
    for section in ("requests", "limits"):
        part = out.get(section)
        if isinstance(part, dict) and "memory" in part:
            size = memory_bytes(part["memory"])
            if size is None:
                continue
            scaled = int(size * factor)
            if cap is not None:
                scaled = min(scaled, cap)
            part["memory"] = str(scaled)
            changed = True
    return out if changed else None


_UNITS = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([kMGT]i?|)$")


def memory_bytes(value: object) -> int | None:
    """A memory quantity (``512Mi``, ``1G``, ``1048576``) in bytes; None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return int(value)
    m = _QUANTITY.match(str(value).strip())
    if not m or m.group(2) not in _UNITS:
        return None
    return int(float(m.group(1)) * _UNITS[m.group(2)])
