"""The caches of node offers: a claim's offer parsed once per distinct offer, the same text the
daemons table keeps, malformed offers refused every time, and bounded; a stored offer's text
parsed once (unreadable: None), and an offer a claim parsed known by its text."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nymph.launch.placement import NodeOffer
from nymph.queue.offers import OfferCache, offer_of, offer_text


def _raw(cpu: str = "7910m", name: str = "node-a") -> dict[str, Any]:
    return {
        "name": name,
        "labels": {"topology.kubernetes.io/zone": "zone-a", "kubernetes.io/hostname": name},
        "taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}],
        "allocatable": {"cpu": cpu, "memory": "31357852Ki", "nvidia.com/gpu": "1"},
    }


def test_an_offer_sent_again_is_the_parse_of_its_first_claim_whatever_its_key_order() -> None:
    cache = OfferCache()
    first = cache.parse(_raw())
    reordered = dict(reversed(list(_raw().items())))
    reordered["allocatable"] = dict(reversed(list(_raw()["allocatable"].items())))
    again = cache.parse(reordered)
    assert again is first
    assert len(cache) == 1
    assert first.offer == NodeOffer.from_json(_raw())
    assert first.text == json.dumps(NodeOffer.from_json(_raw()).to_json(), sort_keys=True)
    assert first.text == offer_text(first.offer)


def test_a_changed_offer_is_parsed_anew() -> None:
    cache = OfferCache()
    before = cache.parse(_raw(cpu="8"))
    after = cache.parse(_raw(cpu="6"))
    assert after is not before
    assert json.loads(after.text)["allocatable"]["cpu"] == "6"
    assert json.loads(before.text)["allocatable"]["cpu"] == "8"
    assert len(cache) == 2


@pytest.mark.parametrize(
    "bad",
    [
        {"name": "n", "allocatable": {"cpu": "lots"}},
        {"name": "n", "labels": ["not", "a", "mapping"]},
        {"name": "n", "taints": [{"value": "no key"}]},
    ],
)
def test_a_malformed_offer_is_refused_every_time_and_never_kept(bad: dict[str, Any]) -> None:
    cache = OfferCache()
    for _ in range(2):
        with pytest.raises(ValueError):
            cache.parse(bad)
    assert len(cache) == 0


def test_the_cache_stays_within_its_bound_and_keeps_the_newest() -> None:
    cache = OfferCache(max_entries=4)
    parsed = [cache.parse(_raw(name=f"node-{i}")) for i in range(9)]
    assert len(cache) <= 4
    assert cache.parse(_raw(name="node-8")) is parsed[-1]


def test_a_stored_offer_is_parsed_once_and_an_unreadable_one_is_none() -> None:
    text = json.dumps(NodeOffer.from_json(_raw(name="stored-node")).to_json(), sort_keys=True)
    first = offer_of(text)
    assert first == NodeOffer.from_json(_raw(name="stored-node"))
    assert offer_of(text) is first
    assert offer_of("not json") is None and offer_of(None) is None and offer_of("") is None


def test_an_offer_a_claim_parsed_is_known_by_its_stored_text() -> None:
    parsed = OfferCache().parse(_raw(name="claimed-node"))
    assert offer_of(parsed.text) is parsed.offer
