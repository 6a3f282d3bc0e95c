"""Node offers as daemons send them with every claim, parsed once per distinct offer.

A daemon sends its node's offer (labels, taints, allocatable) with each claim, and it is the
same offer claim after claim until the node changes. Parsing one (every quantity to a
:class:`~fractions.Fraction`) and writing it back as the text the daemons table keeps costs
about 50 us for a cloud node's offer of twenty-odd labels and seven resources, on every claim,
idle re-polls included. Here an offer is keyed by its canonical JSON (keys sorted, about 1 us)
and parsed on its first claim only. A malformed offer is never kept: it is refused each time.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from nymph.launch.placement import NodeOffer

#: Distinct offers kept (a replica serves at most a few thousand nodes); past that the oldest
#: half goes.
MAX_OFFERS = 8192


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
        if len(self._parsed) >= self.max_entries:
            for old in list(self._parsed)[: self.max_entries // 2]:
                del self._parsed[old]
        self._parsed[key] = parsed
        return parsed

    def __len__(self) -> int:
        return len(self._parsed)
