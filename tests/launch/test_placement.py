"""Node matching (pure): quantities, tolerations, node selectors, free capacity, waiting reasons."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nymph.launch.placement import (
    Needs,
    NodeOffer,
    QuantityError,
    Taint,
    format_quantity,
    misfit,
    node_offer,
    parse_quantity,
    requests_of,
    tolerates,
    untolerated,
    why_waiting,
)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1", Fraction(1)),
        ("500m", Fraction(1, 2)),
        ("0.5", Fraction(1, 2)),
        ("1.5", Fraction(3, 2)),
        ("100Ki", Fraction(102400)),
        ("1Mi", Fraction(2**20)),
        ("4Gi", Fraction(4 * 2**30)),
        ("1k", Fraction(1000)),
        ("2M", Fraction(2_000_000)),
        ("1G", Fraction(10**9)),
        ("1e3", Fraction(1000)),
        ("1E3", Fraction(1000)),
        ("12e-1", Fraction(6, 5)),
        ("128974848", Fraction(128974848)),
        (".5", Fraction(1, 2)),
        ("250u", Fraction(1, 4000)),
        (3, Fraction(3)),
        (0.25, Fraction(1, 4)),
    ],
)
def test_parse_quantity(text: object, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    "text", ["", "abc", "1Gb", "1 Gi", "--1", "1e", "m", True, None, [1], "1e99", float("nan")]
)
def test_parse_quantity_refuses(text: object) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(["Ki", "Mi", "Gi", "k", "M", "G", "m", ""]))
def test_parse_quantity_suffix_scales(n: int, suffix: str) -> None:
    scale = {
        "Ki": 2**10,
        "Mi": 2**20,
        "Gi": 2**30,
        "k": 10**3,
        "M": 10**6,
        "G": 10**9,
        "m": Fraction(1, 1000),
        "": 1,
    }
    assert parse_quantity(f"{n}{suffix}") == n * Fraction(scale[suffix])


@given(
    st.integers(min_value=0, max_value=2**50), st.sampled_from(["cpu", "memory", "pods", "nvidia.com/gpu"])
)
def test_format_then_parse_round_trips(n: int, resource: str) -> None:
    value = Fraction(n, 1000) if resource == "cpu" else Fraction(n)
    assert parse_quantity(format_quantity(value, resource=resource)) == value


def test_tolerations_follow_kubernetes_rules() -> None:
    gpu = Taint(key="gpu", value="a100", effect="NoSchedule")
    assert tolerates({"key": "gpu", "operator": "Equal", "value": "a100", "effect": "NoSchedule"}, gpu)
    assert tolerates({"key": "gpu", "value": "a100"}, gpu)  # Equal is the default, empty effect: all
    assert not tolerates({"key": "gpu", "value": "h100"}, gpu)
    assert tolerates({"key": "gpu", "operator": "Exists"}, gpu)
    assert not tolerates({"key": "gpu", "operator": "Exists", "effect": "NoExecute"}, gpu)
    assert tolerates({"operator": "Exists"}, gpu)  # empty key with Exists: every taint
    assert not tolerates({"operator": "Equal", "value": "a100"}, gpu)  # empty key needs Exists
    assert not tolerates({"key": "other", "operator": "Exists"}, gpu)
    assert not tolerates({"key": "gpu", "operator": "Bogus"}, gpu)


def test_prefer_no_schedule_never_blocks() -> None:
    soft = Taint(key="soft", effect="PreferNoSchedule")
    hard = Taint(key="hard", effect="NoExecute")
    assert untolerated([], [soft, hard]) == [hard]


_KEYS = st.sampled_from(["", "gpu", "zone", "dedicated"])
_EFFECTS = st.sampled_from(["", "NoSchedule", "NoExecute", "PreferNoSchedule"])
_VALUES = st.sampled_from(["", "a", "b"])


@given(
    key=_KEYS,
    value=_VALUES,
    effect=_EFFECTS,
    tkey=_KEYS.filter(bool),
    tvalue=_VALUES,
    teffect=_EFFECTS.filter(bool),
)
def test_toleration_properties(
    key: str, value: str, effect: str, tkey: str, tvalue: str, teffect: str
) -> None:
    taint = Taint(key=tkey, value=tvalue, effect=teffect)
    exists: dict[str, Any] = {"key": key, "operator": "Exists", "effect": effect}
    equal: dict[str, Any] = {"key": key, "operator": "Equal", "value": value, "effect": effect}
    # Exists tolerates at least what Equal tolerates, and nothing tolerates across effects.
    if tolerates(equal, taint):
        assert tolerates(exists, taint)
    if effect and effect != teffect:
        assert not tolerates(exists, taint) and not tolerates(equal, taint)
    # Catch-all tolerates everything.
    assert tolerates({"operator": "Exists"}, taint)


def test_requests_default_to_limits() -> None:
    got = requests_of({"limits": {"cpu": "2", "memory": "1Gi"}, "requests": {"cpu": "500m"}})
    assert got == {"cpu": Fraction(1, 2), "memory": Fraction(2**30)}
    assert requests_of(None) == {}


def _offer(**kw: Any) -> NodeOffer:
    return NodeOffer(name=kw.pop("name", "n1"), **kw)


def test_misfit_reasons() -> None:
    gpu_node = _offer(
        labels={"gpu": "a100"},
        taints=(Taint(key="gpu", value="a100", effect="NoSchedule"),),
        allocatable={"cpu": Fraction(4), "memory": Fraction(8 * 2**30)},
    )
    needs = Needs(node_selector=(("gpu", "a100"),), tolerations=({"key": "gpu", "operator": "Exists"},))
    assert misfit(needs, gpu_node) is None
    reason = misfit(Needs(node_selector=(("gpu", "h100"),)), gpu_node)
    assert reason == "node_selector gpu=h100 does not match"
    assert misfit(Needs(), gpu_node) == "taint gpu=a100:NoSchedule is not tolerated"
    big = Needs(tolerations=({"operator": "Exists"},), requests={"cpu": Fraction(3)})
    assert misfit(big, gpu_node) is None
    assert misfit(big, gpu_node, used={"cpu": Fraction(2)}) == "cpu request 3 exceeds the 2 free"
    assert "nvidia.com/gpu" in (
        misfit(
            Needs(tolerations=({"operator": "Exists"},), requests={"nvidia.com/gpu": Fraction(1)}), gpu_node
        )
        or ""
    )


@given(
    alloc=st.integers(min_value=0, max_value=64_000),
    used=st.integers(min_value=0, max_value=64_000),
    req=st.integers(min_value=1, max_value=64_000),
)
def test_capacity_is_allocatable_minus_used(alloc: int, used: int, req: int) -> None:
    offer = _offer(allocatable={"cpu": Fraction(alloc, 1000)})
    needs = Needs(requests={"cpu": Fraction(req, 1000)})
    fits = misfit(needs, offer, used={"cpu": Fraction(used, 1000)}) is None
    assert fits == (req <= alloc - used)


def test_node_offer_from_node_object_round_trips() -> None:
    node = {
        "metadata": {"name": "gpu-1", "labels": {"gpu": "a100", "kubernetes.io/hostname": "gpu-1"}},
        "spec": {"taints": [{"key": "gpu", "value": "a100", "effect": "NoSchedule"}]},
        "status": {"allocatable": {"cpu": "7500m", "memory": "16Gi", "pods": "110", "bad": "x"}},
    }
    offer = node_offer(node)
    assert offer.allocatable == {
        "cpu": Fraction(15, 2),
        "memory": Fraction(16 * 2**30),
        "pods": Fraction(110),
    }
    assert offer.taints == (Taint(key="gpu", value="a100", effect="NoSchedule"),)
    assert NodeOffer.from_json(offer.to_json()) == offer


def test_needs_from_spec_json() -> None:
    spec = {
        "nodeSelector": [["gpu", "a100"]],
        "tolerations": [{"key": "gpu", "operator": "Exists"}],
        "resources": {"requests": {"cpu": "1"}},
    }
    needs = Needs.from_spec(spec)
    assert needs.node_selector == (("gpu", "a100"),)
    assert needs.requests == {"cpu": Fraction(1)}
    assert Needs.from_spec(None) == Needs()


def test_why_waiting() -> None:
    cpu = _offer(name="cpu", labels={"pool": "cpu"}, allocatable={"cpu": Fraction(2)})
    gpu = _offer(
        name="gpu",
        labels={"pool": "gpu", "gpu": "a100"},
        taints=(Taint(key="gpu", effect="NoSchedule"),),
        allocatable={"cpu": Fraction(8)},
    )
    offers = [(cpu, {}), (gpu, {})]
    assert why_waiting(Needs(node_selector=(("gpu", "h100"),)), offers) == (
        "no daemon's node matches node_selector gpu=h100"
    )
    assert why_waiting(Needs(node_selector=(("gpu", "a100"),)), offers) == (
        "no daemon's node tolerates its taints (untolerated: gpu:NoSchedule)"
    )
    assert why_waiting(Needs(requests={"cpu": Fraction(16)}), offers) == (
        "no daemon's node has the allocatable resources for requests cpu=16"
    )
    assert why_waiting(Needs(requests={"cpu": Fraction(2)}), [(cpu, {"cpu": Fraction(1)})]) == (
        "waiting for free capacity on a matching node"
    )
    assert why_waiting(Needs(), offers) is None
    assert why_waiting(Needs(), []) == "no live daemon serves this kube namespace"


_TOLERATION = st.dictionaries(
    st.sampled_from(["key", "operator", "value", "effect", "tolerationSeconds"]),
    st.one_of(st.text(max_size=3), st.integers(0, 3), st.none()),
    max_size=4,
)
_NEEDS = st.builds(
    Needs,
    node_selector=st.lists(st.tuples(st.text(max_size=2), st.text(max_size=2)), max_size=2).map(tuple),
    tolerations=st.lists(_TOLERATION, max_size=2).map(tuple),
    requests=st.dictionaries(
        st.sampled_from(["cpu", "memory", "nvidia.com/gpu"]), st.fractions(0, 8), max_size=3
    ),
    avoid=st.lists(st.text(max_size=2), max_size=2).map(tuple),
)


@given(_NEEDS, _NEEDS)
def test_needs_share_a_key_exactly_when_they_are_equal(a: Needs, b: Needs) -> None:
    """The sweep judges launches with equal needs once, by their key: two needs have the same
    key only when they are equal (never a reason given for other needs), and the order a
    toleration's fields or the requests were written in does not change it."""
    assert (a.key() == b.key()) == (a == b)
    reordered = Needs(
        node_selector=a.node_selector,
        tolerations=tuple(dict(reversed(list(t.items()))) for t in a.tolerations),
        requests=dict(reversed(list(a.requests.items()))),
        avoid=a.avoid,
    )
    assert reordered.key() == a.key()
    assert hash(reordered.key()) == hash(a.key())
