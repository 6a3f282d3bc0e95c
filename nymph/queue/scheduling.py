"""Which launch a claim hands out next (pure: plain data in, a decision out).

The unit of sharing is the control-plane namespace of a launch (a team). Between namespaces,
the next task goes to the one with the lowest *share* divided by its weight; inside one,
higher ``priority`` goes first, then first in, first out. A namespace's share is its dominant
share (Dominant Resource Fairness): the largest fraction, over every resource its running
launches request and the daemon slots they hold, of what the live daemons offer. Ties go to
the namespace whose next launch has waited longest. A namespace whose quota
(``maxRunning``, ``resources``) the launch would pass is skipped, never waited for, so the
queue stays work-conserving: what one namespace cannot use goes to the others.

A launch counts as running for shares and quotas from the moment a daemon holds its lease (on
the direct path, from its Pod's creation) until it is stopped. The SQL that gathers these
inputs is :mod:`nymph.queue.sql.schedule`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from nymph.launch.placement import add, format_quantity

#: The resource name daemon slots are counted under (every launch holds one slot).
SLOTS = "slots"


@dataclass(frozen=True)
class Quota:
    """An operator's settings for one namespace (all optional but the weight)."""

    weight: Fraction = Fraction(1)
    max_running: int | None = None
    resources: Mapping[str, Fraction] = field(default_factory=dict)
    #: Seconds: the longest run a launch may ask for, and the run a launch gets when it names none.
    max_runtime: int | None = None
    default_runtime: int | None = None

    @property
    def caps_starts(self) -> bool:
        """Whether it can hold a launch back (a cap on running launches or on a resource):
        without one, :func:`quota_blocks` never does, whatever the namespace holds."""
        return self.max_running is not None or bool(self.resources)


@dataclass(frozen=True)
class Usage:
    """What a namespace's running launches hold: how many, and the sum of their requests."""

    running: int = 0
    requests: Mapping[str, Fraction] = field(default_factory=dict)

    def plus(self, requests: Mapping[str, Fraction]) -> Usage:
        return Usage(running=self.running + 1, requests=add(self.requests, requests))


@dataclass(frozen=True)
class Candidate:
    """The next launch of one group (a namespace's launches that share their placement needs):
    its queue key, namespace, priority, when it was queued, and what it requests. ``charged``:
    it already counts as running (a claim again after its lease expired, or a moved launch)."""

    seq: int
    namespace: str
    priority: int
    queued_at: float
    requests: Mapping[str, Fraction] = field(default_factory=dict)
    charged: bool = False


def quota_blocks(namespace: str, quota: Quota, usage: Usage, requests: Mapping[str, Fraction]) -> str | None:
    """None if ``quota`` lets the namespace start one more launch requesting ``requests``; else
    why not, for the launch's waiting reason (``team-a at maxRunning 50 of 50``)."""
    if quota.max_running is not None and usage.running + 1 > quota.max_running:
        return f"{namespace} at maxRunning {usage.running} of {quota.max_running}"
    for resource, cap in sorted(quota.resources.items()):
        asked = requests.get(resource, Fraction(0))
        if asked <= 0:
            continue
        held = usage.requests.get(resource, Fraction(0))
        if held + asked > cap:
            return (
                f"{namespace} at {resource} {format_quantity(held, resource=resource)} of "
                f"{format_quantity(cap, resource=resource)} (this launch asks "
                f"{format_quantity(asked, resource=resource)})"
            )
    return None


def dominant_share(usage: Usage, totals: Mapping[str, Fraction]) -> Fraction:
    """The largest fraction of any offered resource (daemon slots included, under
    :data:`SLOTS`) the namespace's running launches hold. A resource nobody offers is left out;
    with no offer at all the share is the running count itself."""
    held = {**usage.requests, SLOTS: Fraction(usage.running)}
    shares = [held[r] / totals[r] for r in held if totals.get(r, Fraction(0)) > 0 and held[r] > 0]
    if shares:
        return max(shares)
    return Fraction(usage.running)


def weighted_share(usage: Usage, quota: Quota, totals: Mapping[str, Fraction]) -> Fraction:
    weight = quota.weight if quota.weight > 0 else Fraction(1)
    return dominant_share(usage, totals) / weight


def _better_in_namespace(a: Candidate, b: Candidate) -> bool:
    """Whether ``a`` goes before ``b`` inside one namespace: higher priority, then older."""
    return (-a.priority, a.seq) < (-b.priority, b.seq)


def best_per_namespace(candidates: Iterable[Candidate]) -> dict[str, Candidate]:
    best: dict[str, Candidate] = {}
    for c in candidates:
        cur = best.get(c.namespace)
        if cur is None or _better_in_namespace(c, cur):
            best[c.namespace] = c
    return best


def allowed(candidate: Candidate, *, quotas: Mapping[str, Quota], usage: Mapping[str, Usage]) -> bool:
    """Whether the namespace's quota lets this candidate start (one already counted always may)."""
    if candidate.charged:
        return True
    quota = quotas.get(candidate.namespace, Quota())
    return (
        quota_blocks(candidate.namespace, quota, usage.get(candidate.namespace, Usage()), candidate.requests)
        is None
    )


def pick_next(
    candidates: Sequence[Candidate],
    *,
    quotas: Mapping[str, Quota],
    usage: Mapping[str, Usage],
    totals: Mapping[str, Fraction],
    recent: Mapping[str, float] | None = None,
) -> Candidate | None:
    """The candidate to hand out next, among those the claiming node can run (the caller keeps
    only those): per namespace its best candidate the quota allows, then the namespace with the
    lowest weighted share. Ties (most often: nothing running, when launches end before the next
    claim) go to the namespace that was handed the fewest launches lately (``recent``: a decaying
    count per namespace, see :func:`decayed`) for its weight, then to the one whose candidate has
    waited longest, then by name."""
    runnable = best_per_namespace(c for c in candidates if allowed(c, quotas=quotas, usage=usage))
    if not runnable:
        return None
    lately = recent or {}

    def key(c: Candidate) -> tuple[Fraction, float, float, int, str]:
        quota = quotas.get(c.namespace, Quota())
        share = weighted_share(usage.get(c.namespace, Usage()), quota, totals)
        weight = float(quota.weight) if quota.weight > 0 else 1.0
        return share, lately.get(c.namespace, 0.0) / weight, c.queued_at, c.seq, c.namespace

    return min(runnable.values(), key=key)


#: How fast the count of launches a namespace was handed lately fades: halved every this many seconds.
RECENT_HALF_LIFE = 300.0


def decayed(count: float, *, since: float, now: float) -> float:
    """``count`` as it stands ``now - since`` seconds later (halved every RECENT_HALF_LIFE)."""
    return float(count * 0.5 ** (max(now - since, 0.0) / RECENT_HALF_LIFE))


def charge(usage: Mapping[str, Usage], candidate: Candidate) -> dict[str, Usage]:
    """The usage after ``candidate`` starts (unchanged if it was already counted)."""
    out = dict(usage)
    if not candidate.charged:
        out[candidate.namespace] = out.get(candidate.namespace, Usage()).plus(candidate.requests)
    return out


def ordinal(n: int) -> str:
    """1 -> '1st', 2 -> '2nd', 11 -> '11th', 23 -> '23rd'."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
