"""Node offers, parsed once per distinct offer: as daemons send them with every claim
(:class:`OfferCache`), and as the daemons table keeps them (:func:`offer_of`).

A daemon sends its node's offer (labels, taints, allocatable) with each claim, and it is the
same offer claim after claim until the node changes. Parsing one (every quantity to a
:class:`~fractions.Fraction`) and writing it back as the text the daemons table keeps costs
about 50 us for a cloud node's offer of twenty-odd labels and seven resources, on every claim,
idle re-polls included. Here an offer is keyed by its canonical JSON (keys sorted, about 1 us)
and parsed on its first claim only. A malformed offer is never kept: it is refused each time.
The scheduler reads a thousand daemons' stored offers again on every sweep: each stored text
is parsed once too (an offer a claim parsed is already known by its text).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson

from nymph.launch.placement import NodeOffer

K = TypeVar("K")
V = TypeVar("V")

#: Distinct offers kept (a replica serves at most a few thousand nodes); past that the oldest
#: half goes.
MAX_OFFERS = 8192

#: Stored offer texts, parsed (None: unreadable), for :func:`offer_of`.
_STORED: dict[str, NodeOffer | None] = {}


def _keep(store: dict[K, V], key: K, value: V, limit: int) -> V:
    """``store[key] = value``, the oldest half of ``store`` dropped first when it is full."""
    if len(store) >= limit:
        for old in list(store)[: limit // 2]:
            del store[old]
    store[key] = value
    return value


def offer_of(text: str | None) -> NodeOffer | None:
    """A daemon's offer as the daemons table keeps it, parsed (each text once); None when
    absent or unreadable."""
    if not text:
        return None
    if text in _STORED:
        return _STORED[text]
    try:
        offer: NodeOffer | None = NodeOffer.from_json(json.loads(text))
    except ValueError:
        offer = None
    return _keep(_STORED, text, offer, MAX_OFFERS)


@dataclass(frozen=True)
class ParsedOffer:
    """An offer and the text the daemons table keeps for it (sorted keys, canonical quantities)."""

    offer: NodeOffer
    text: str


def offer_text(offer: NodeOffer) -> str:
    """The text the daemons table keeps for ``offer``."""
    return json.dumps(offer.to_json(), sort_keys=True)


class OfferCache:
    def __init__(self, max_entries: int = MAX_OFFERS) -> None:
        self.max_entries = max_entries
        self._parsed: dict[bytes, ParsedOffer] = {}

    def parse(self, raw: Mapping[str, Any]) -> ParsedOffer:
        """``raw`` (a claim's ``nodeInfo``) parsed, from the cache when seen before. Raises
        ValueError (a :class:`~nymph.launch.placement.QuantityError` for a bad quantity) on a
        malformed offer, as :meth:`NodeOffer.from_json` does."""
        try:
            key = orjson.dumps(raw, option=orjson.OPT_SORT_KEYS)
        except TypeError:  # not plain JSON orjson takes (an integer past 64 bits): parsed, not kept
            offer = NodeOffer.from_json(raw)
            return ParsedOffer(offer=offer, text=offer_text(offer))
        hit = self._parsed.get(key)
        if hit is not None:
            return hit
        offer = NodeOffer.from_json(raw)
        parsed = ParsedOffer(offer=offer, text=offer_text(offer))
        if parsed.text not in _STORED:  # the text this daemon's record will hold
            _keep(_STORED, parsed.text, offer, MAX_OFFERS)
        return _keep(self._parsed, key, parsed, self.max_entries)

    def __len__(self) -> int:
        return len(self._parsed)
