"""Applying manifests, written once for Pods and dockyard objects: timed, retried, bounded.

Failures are classified by the applier: transient ones (connection, throttling, conflicts) are
retried here with exponential backoff and jitter, at most :attr:`RetryPolicy.attempts` times;
what is still failing after that is handed back to the caller, which fails the task (retryable
when the failure is transient, so the queue hands it out again later).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nymph.daemon.metrics import Metrics
from nymph.errors import ConfigError
from nymph.kube.applier import Applier, ApplyOutcome, object_key
from nymph.kube.errors import KubeError


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to apply again. Every number is bounded."""

    attempts: int = 3  # applies in all, the first one included
    base_delay: float = 0.5  # seconds after the first failed attempt; doubles after each
    max_delay: float = 30.0  # no wait (before jitter) is longer than this

    def __post_init__(self) -> None:
        if not 1 <= self.attempts <= 20:
            raise ConfigError(f"retry attempts must be between 1 and 20, not {self.attempts}")
        if not 0 <= self.base_delay <= self.max_delay:
            raise ConfigError("retry delays must satisfy 0 <= base_delay <= max_delay")

    def again(self, attempt: int) -> bool:
        """Whether a failed ``attempt`` (1-based) may be followed by another one."""
        return attempt < self.attempts

    def delay(self, attempt: int, *, jitter: float) -> float:
        """Seconds to wait after failed ``attempt``: the backoff plus ``jitter`` (0..1) of it."""
        backoff = min(self.base_delay * 2.0 ** (attempt - 1), self.max_delay)
        return backoff + backoff * min(max(jitter, 0.0), 1.0)


#: The policy both Pod launches and dockyard launches use.
APPLY_RETRY = RetryPolicy()


async def timed_apply(
    applier: Applier, manifests: Sequence[Mapping[str, Any]], *, metrics: Metrics, dry_run: bool = False
) -> list[ApplyOutcome]:
    """One apply of ``manifests``; an error of the whole call becomes every manifest's outcome
    (an unexpected one as a permanent :class:`KubeError` naming it)."""
    t0 = time.monotonic()
    try:
        return await applier.apply(manifests, dry_run=dry_run)
    except KubeError as exc:
        return [ApplyOutcome(*object_key(m), error=exc) for m in manifests]
    except (ValueError, TypeError, RecursionError, OSError) as exc:
        err = KubeError(f"the apply failed: {exc.__class__.__name__}: {str(exc)[:500]}")
        return [ApplyOutcome(*object_key(m), error=err) for m in manifests]
    finally:
        metrics.apply_seconds.labels(applier.name).observe(time.monotonic() - t0)
        metrics.apply_batch.observe(len(manifests))


async def _backoff(policy: RetryPolicy, attempt: int) -> None:
    await asyncio.sleep(policy.delay(attempt, jitter=random.random()))


async def apply_each(
    *,
    applier: Applier,
    manifests: Sequence[Mapping[str, Any]],
    metrics: Metrics,
    policy: RetryPolicy = APPLY_RETRY,
    retry: Callable[[int, ApplyOutcome], bool],
    settle: Callable[[int, ApplyOutcome], None],
) -> None:
    """Independent manifests (Pods): each outcome is settled as soon as it is final.

    A failed outcome that ``retry(index, outcome)`` accepts is applied again (with the others still pending, in
    one call) while the policy allows; ``settle(index, outcome)`` gets every final outcome.
    """
    pending = list(range(len(manifests)))
    attempt = 1
    while pending:
        outcomes = await _isolating_apply(applier, [manifests[i] for i in pending], metrics=metrics)
        again: list[int] = []
        for index, outcome in zip(pending, outcomes, strict=True):
            if outcome.error is not None and policy.again(attempt) and retry(index, outcome):
                again.append(index)
            else:
                settle(index, outcome)
        pending = again
        if pending:
            await _backoff(policy, attempt)
            attempt += 1


def _refused_whole(outcomes: Sequence[ApplyOutcome]) -> bool:
    """The call failed as a whole, for a reason that is not transient (one bad manifest can do
    that: kubectl parses the whole stream before it applies any of it)."""
    errors = {id(o.error): o.error for o in outcomes}
    (err,) = errors.values() if len(errors) == 1 else (None,)
    return err is not None and not err.transient


async def _isolating_apply(
    applier: Applier, manifests: Sequence[Mapping[str, Any]], *, metrics: Metrics
) -> list[ApplyOutcome]:
    """One apply of a batch; when the batch is refused as a whole, each manifest again alone,
    so the innocent ones do not lose an attempt to the bad one."""
    outcomes = await timed_apply(applier, manifests, metrics=metrics)
    if len(manifests) > 1 and _refused_whole(outcomes):
        outcomes = [(await timed_apply(applier, [m], metrics=metrics))[0] for m in manifests]
    return outcomes


async def apply_all(
    *,
    applier: Applier,
    manifests: Sequence[Mapping[str, Any]],
    metrics: Metrics,
    policy: RetryPolicy = APPLY_RETRY,
) -> list[ApplyOutcome]:
    """Objects that belong together (dockyard): all, in order; again (all, in order: idempotent)
    while every failure is transient and the policy allows. The last outcomes, same order."""
    attempt = 1
    while True:
        outcomes = await timed_apply(applier, manifests, metrics=metrics)
        errors = [o.error for o in outcomes if o.error is not None]
        if not errors or not policy.again(attempt) or not all(e.transient for e in errors):
            return outcomes
        await _backoff(policy, attempt)
        attempt += 1
