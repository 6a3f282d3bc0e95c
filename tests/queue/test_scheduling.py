"""The scheduling decision on plain data: which namespace goes next (fair share by weight, ties
to the longest waiting), which launch inside it (priority, then first in), and what a quota
allows; with property tests that no quota is passed, nothing runnable is held back, and long-run
shares follow the weights."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nymph.errors import ValidationError
from nymph.queue.quotas import merge, quota_json
from nymph.queue.scheduling import (
    RECENT_HALF_LIFE,
    SLOTS,
    Candidate,
    Quota,
    Usage,
    charge,
    decayed,
    dominant_share,
    ordinal,
    pick_next,
    quota_blocks,
)

F = Fraction


def cand(seq: int, ns: str, *, priority: int = 0, at: float | None = None, **requests: str) -> Candidate:
    return Candidate(
        seq=seq,
        namespace=ns,
        priority=priority,
        queued_at=float(seq) if at is None else at,
        requests={k.replace("_", "."): F(v) for k, v in requests.items()},
    )


def test_the_namespace_with_the_lowest_share_goes_first() -> None:
    cands = [cand(1, "big"), cand(50, "small")]
    usage = {"big": Usage(running=5), "small": Usage(running=1)}
    got = pick_next(cands, quotas={}, usage=usage, totals={SLOTS: F(10)})
    assert got is not None and got.namespace == "small"


def test_weights_scale_the_share() -> None:
    cands = [cand(1, "a"), cand(2, "b")]
    usage = {"a": Usage(running=3), "b": Usage(running=2)}
    quotas = {"a": Quota(weight=F(2))}
    # a holds 3/2 = 1.5 weighted slots, b holds 2: a goes next
    got = pick_next(cands, quotas=quotas, usage=usage, totals={SLOTS: F(10)})
    assert got is not None and got.namespace == "a"


def test_ties_go_to_the_launch_that_waited_longest() -> None:
    cands = [cand(7, "a", at=100.0), cand(9, "b", at=50.0)]
    got = pick_next(cands, quotas={}, usage={}, totals={SLOTS: F(4)})
    assert got is not None and got.namespace == "b"


def test_inside_a_namespace_priority_then_first_in() -> None:
    cands = [cand(1, "a"), cand(2, "a", priority=5), cand(3, "a", priority=5)]
    got = pick_next(cands, quotas={}, usage={}, totals={})
    assert got is not None and got.seq == 2


def test_priority_never_beats_the_fair_share() -> None:
    cands = [cand(1, "a", priority=1000), cand(2, "b", priority=-1000)]
    usage = {"a": Usage(running=2)}
    got = pick_next(cands, quotas={}, usage=usage, totals={SLOTS: F(4)})
    assert got is not None and got.namespace == "b"


def test_dominant_share_takes_the_scarcest_resource() -> None:
    totals = {SLOTS: F(100), "cpu": F(10), "nvidia.com/gpu": F(2)}
    gpu_user = Usage(running=1, requests={"cpu": F(1), "nvidia.com/gpu": F(1)})
    cpu_user = Usage(running=4, requests={"cpu": F(4)})
    assert dominant_share(gpu_user, totals) == F(1, 2)
    assert dominant_share(cpu_user, totals) == F(2, 5)
    got = pick_next(
        [cand(1, "gpu"), cand(2, "cpu")],
        quotas={},
        usage={"gpu": gpu_user, "cpu": cpu_user},
        totals=totals,
    )
    assert got is not None and got.namespace == "cpu"


def test_max_running_holds_a_namespace_and_says_so() -> None:
    quota = Quota(max_running=2)
    assert quota_blocks("team-a", quota, Usage(running=1), {}) is None
    assert quota_blocks("team-a", quota, Usage(running=2), {}) == "team-a at maxRunning 2 of 2"
    # held back, the other namespace gets the slot even with a larger share
    got = pick_next(
        [cand(1, "team-a"), cand(2, "team-b")],
        quotas={"team-a": quota},
        usage={"team-a": Usage(running=2), "team-b": Usage(running=5)},
        totals={SLOTS: F(10)},
    )
    assert got is not None and got.namespace == "team-b"


def test_a_resource_quota_counts_the_requests() -> None:
    quota = Quota(resources={"cpu": F(4)})
    usage = Usage(running=1, requests={"cpu": F(3)})
    assert quota_blocks("a", quota, usage, {"cpu": F(1)}) is None
    reason = quota_blocks("a", quota, usage, {"cpu": F(2)})
    assert reason == "a at cpu 3 of 4 (this launch asks 2)"
    # a launch that requests none of the capped resource passes
    assert quota_blocks("a", quota, usage, {"memory": F(10**9)}) is None


_amounts = st.fractions(min_value=0, max_value=10**6, max_denominator=1000)
_requests = st.dictionaries(st.sampled_from(["cpu", "memory", "nvidia.com/gpu"]), _amounts, max_size=3)


@given(
    quota=st.builds(
        Quota,
        weight=st.fractions(min_value=F(1, 100), max_value=100, max_denominator=100),
        max_running=st.none() | st.integers(0, 50),
        resources=_requests,
        max_runtime=st.none() | st.integers(1, 10**5),
    ),
    usage=st.builds(Usage, running=st.integers(0, 10**4), requests=_requests),
    requests=_requests,
)
def test_a_quota_that_caps_nothing_never_holds_a_launch(
    quota: Quota, usage: Usage, requests: dict[str, Fraction]
) -> None:
    """Direct launches skip reading the namespace's usage when its quota caps nothing: that is
    only sound if such a quota passes every launch, whatever the namespace holds."""
    if not quota.caps_starts:
        assert quota_blocks("a", quota, usage, requests) is None
    if quota_blocks("a", quota, usage, requests) is not None:
        assert quota.caps_starts


def test_a_launch_already_counted_is_never_held_by_its_own_quota() -> None:
    held = Candidate(seq=1, namespace="a", priority=0, queued_at=0.0, charged=True)
    got = pick_next([held], quotas={"a": Quota(max_running=1)}, usage={"a": Usage(running=1)}, totals={})
    assert got == held
    assert charge({"a": Usage(running=1)}, held) == {"a": Usage(running=1)}


def test_nothing_allowed_means_nothing_picked() -> None:
    got = pick_next([cand(1, "a")], quotas={"a": Quota(max_running=0)}, usage={}, totals={})
    assert got is None


def test_ordinals() -> None:
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 23, 101, 111)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "23rd", "101st", "111th",
    ]  # fmt: skip


# --- quota bodies --------------------------------------------------------------------------------


def test_a_quota_body_merges_keys_and_null_removes_a_limit() -> None:
    q = merge(Quota(), {"weight": 2, "maxRunning": 50, "resources": {"cpu": "64", "memory": "256Gi"}})
    assert q.weight == 2 and q.max_running == 50 and q.resources["memory"] == 256 * 2**30
    q = merge(q, {"maxRuntime": "1d", "defaultRuntime": 3600})
    assert (q.max_runtime, q.default_runtime, q.max_running) == (86400, 3600, 50)
    q = merge(q, {"maxRunning": None, "weight": None})
    assert q.max_running is None and q.weight == 1 and q.max_runtime == 86400
    body = quota_json("team-a", q, Usage(running=3, requests={"cpu": F(3, 2)}))
    assert body["resources"] == {"cpu": "64", "memory": "256Gi"}
    assert body["usage"] == {"running": 3, "resources": {"cpu": "1500m"}}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"weight": 0}, "quota.weight"),
        ({"weight": "x"}, "quota.weight"),
        ({"weight": True}, "quota.weight"),
        ({"maxRunning": -1}, "quota.maxRunning"),
        ({"maxRunning": 1.5}, "quota.maxRunning"),
        ({"resources": {"cpu": "lots"}}, "quota.resources.cpu"),
        ({"resources": ["cpu"]}, "quota.resources"),
        ({"maxRuntime": "2 weeks"}, "quota.maxRuntime"),
        ({"maxRuntime": "1h", "defaultRuntime": "2h"}, "quota.defaultRuntime"),
        ({"maxrunning": 3}, "quota.maxrunning"),
    ],
)
def test_a_bad_quota_body_names_the_key(body: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        merge(Quota(), body)
    assert err.value.field == field


# --- properties ----------------------------------------------------------------------------------

namespaces = st.sampled_from(["a", "b", "c", "d"])


@st.composite
def backlogs(draw: st.DrawFn) -> tuple[list[Candidate], dict[str, Quota], dict[str, Usage]]:
    n = draw(st.integers(min_value=1, max_value=30))
    cands = [
        Candidate(
            seq=i,
            namespace=draw(namespaces),
            priority=draw(st.integers(min_value=-3, max_value=3)),
            queued_at=float(draw(st.integers(min_value=0, max_value=100))),
            requests={"cpu": F(draw(st.integers(min_value=0, max_value=4)))},
        )
        for i in range(n)
    ]
    quotas = {
        ns: Quota(
            weight=F(draw(st.integers(min_value=1, max_value=4))),
            max_running=draw(st.none() | st.integers(min_value=0, max_value=5)),
            resources=draw(st.sampled_from([{}, {"cpu": F(4)}, {"cpu": F(0)}])),
        )
        for ns in draw(st.sets(namespaces))
    }
    usage = {
        ns: Usage(
            running=draw(st.integers(min_value=0, max_value=6)), requests={"cpu": F(draw(st.integers(0, 6)))}
        )
        for ns in draw(st.sets(namespaces))
    }
    return cands, quotas, usage


@given(backlogs())
@settings(max_examples=300, deadline=None)
def test_nothing_runnable_is_held_back_and_no_quota_is_passed(
    data: tuple[list[Candidate], dict[str, Quota], dict[str, Usage]],
) -> None:
    cands, quotas, usage = data
    remaining = list(cands)
    while True:
        got = pick_next(remaining, quotas=quotas, usage=usage, totals={SLOTS: F(20), "cpu": F(16)})
        allowed = [
            c
            for c in remaining
            if quota_blocks(
                c.namespace, quotas.get(c.namespace, Quota()), usage.get(c.namespace, Usage()), c.requests
            )
            is None
        ]
        if got is None:
            assert allowed == []  # only launches every quota holds are left waiting
            break
        assert got in allowed
        # the best of its namespace: no allowed launch there with a higher priority or older
        same = [c for c in allowed if c.namespace == got.namespace]
        assert all((-got.priority, got.seq) <= (-c.priority, c.seq) for c in same)
        usage = charge(usage, got)
        remaining.remove(got)
    for ns, quota in quotas.items():
        held = usage.get(ns, Usage())
        start = data[2].get(ns, Usage())
        if quota.max_running is not None and held.running > start.running:
            assert held.running <= quota.max_running
        for resource, cap in quota.resources.items():
            if held.requests.get(resource, F(0)) > start.requests.get(resource, F(0)):
                assert held.requests[resource] <= cap


@given(
    weights=st.dictionaries(namespaces, st.integers(min_value=1, max_value=4), min_size=2),
    seed=st.integers(min_value=0, max_value=2**32),
)
@settings(max_examples=40, deadline=None)
def test_long_run_shares_follow_the_weights(weights: dict[str, int], seed: int) -> None:
    """A cluster of 300 slots, every namespace with more work than it can run, launches ending at
    random: the time-averaged slots each namespace holds is within 10% of its weighted share."""
    rng = random.Random(seed)
    slots = 300
    quotas = {ns: Quota(weight=F(w)) for ns, w in weights.items()}
    usage: dict[str, Usage] = {}
    running: list[str] = []
    held_sum = dict.fromkeys(weights, 0)
    seq = 0
    steps = 3000
    for _ in range(steps):
        while len(running) < slots:
            seq += 1
            cands = [
                Candidate(seq=seq * 10 + i, namespace=ns, priority=0, queued_at=float(seq))
                for i, ns in enumerate(weights)
            ]
            got = pick_next(cands, quotas=quotas, usage=usage, totals={SLOTS: F(slots)})
            assert got is not None
            usage = charge(usage, got)
            running.append(got.namespace)
        done = running.pop(rng.randrange(len(running)))
        usage[done] = Usage(running=usage[done].running - 1)
        for ns in weights:
            held_sum[ns] += usage.get(ns, Usage()).running
    total_weight = sum(weights.values())
    for ns, w in weights.items():
        expected = (slots - 1) * w / total_weight
        assert abs(held_sum[ns] / steps - expected) <= 0.1 * expected, (ns, held_sum[ns] / steps, expected)


def test_equal_shares_go_to_the_namespace_served_least_lately() -> None:
    """With nothing running (launches that end before the next claim), the namespace handed the
    fewest launches lately for its weight goes first, not the one with the oldest backlog."""
    cands = [cand(1, "big", at=0.0), cand(2, "small", at=100.0)]
    got = pick_next(cands, quotas={}, usage={}, totals={SLOTS: F(4)}, recent={"big": 3.0, "small": 1.0})
    assert got is not None and got.namespace == "small"
    weighted = {"big": Quota(weight=F(4))}
    got = pick_next(cands, quotas=weighted, usage={}, totals={SLOTS: F(4)}, recent={"big": 3.0, "small": 1.0})
    assert got is not None and got.namespace == "big"  # 3/4 < 1/1


def test_a_recent_count_fades_by_half_every_half_life() -> None:
    assert decayed(8.0, since=0.0, now=0.0) == 8.0
    assert decayed(8.0, since=0.0, now=RECENT_HALF_LIFE) == pytest.approx(4.0)
    assert decayed(8.0, since=0.0, now=3 * RECENT_HALF_LIFE) == pytest.approx(1.0)
    assert decayed(8.0, since=10.0, now=5.0) == 8.0  # a clock step back never grows it
