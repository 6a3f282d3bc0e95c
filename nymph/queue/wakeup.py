"""What a wake-up for new work is for, and whether a waiting claim may take it.

A new launch wakes only the waiting claims whose daemon serves its kube namespace and whose
node could run it if nothing else ran there (:func:`nymph.launch.placement.misfit` against the
node's offer): a launch only a few nodes can run does not wake, one claim after another, every
daemon of a thousand-node cluster. The test is a necessary condition only (what is placed on
the node, quotas and shares are the claim's to read), so it never keeps a wake from a claim
that could take the work; work of any other kind wakes any claim
(:class:`nymph.queue.notify.WorkSignal`). A wake relayed to the other replicas carries the
launch's kube namespace and the spec fields its needs come from (:meth:`LaunchWork.wire`), so
there too it wakes only the claims that could take it.

Nodes of one pool offer the same labels, taints and allocatable under different names, so each
check is worked out once per such offer and needs (:data:`_JUDGED`), and the rest are a
dictionary lookup; and a wake for work nobody may take asks each such group of claims once,
not each claim (:meth:`ClaimAccepts.group_may`).
Everything here runs on the event loop's thread.
"""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Mapping, Sequence
from typing import Any

from nymph.launch.placement import Needs, NodeOffer, misfit

#: Whether an offer can run needs that avoid no node, by their numbers (:func:`_number`): the
#: offer's labels, taints and allocatable (its name left out), and :meth:`Needs.key`.
_JUDGED: dict[tuple[int, int], bool] = {}
#: Each offer's and each needs' number: two small integers make a key far cheaper to hash than
#: the two keys themselves, for each of a thousand claims. Numbers are never reused, so a
#: judgement kept under one can only be about what it stands for.
_NUMBERS: dict[tuple[str, object], int] = {}
_counter = itertools.count()
_MAX = 16384
#: The launch spec's fields a launch's needs are read from (:meth:`Needs.from_spec`): what a
#: wake-up relayed to another replica carries of its spec.
NEEDS_FIELDS = ("nodeSelector", "tolerations", "resources", "avoidNodes")
#: The longest wire form a wake-up is relayed with (a notify's payload holds under 8,000
#: bytes); a launch whose needs take more is relayed as a bare count, which wakes any claim.
WIRE_MAX = 2000


def _number(kind: str, key: object) -> int:
    got = _NUMBERS.get((kind, key))
    if got is None:
        if len(_NUMBERS) >= _MAX:
            _NUMBERS.clear()
        got = _NUMBERS[(kind, key)] = next(_counter)
    return got


class LaunchWork:
    """A queued launch, as a wake-up carries it. Its needs (``needs``, or read from its task's
    ``spec`` when first asked) and their number are worked out once, and only when a waiting
    claim is asked about it: a launch POSTed while no claim waits pays nothing for them."""

    def __init__(
        self, *, kube_namespace: str, needs: Needs | None = None, spec: Mapping[str, Any] | None = None
    ) -> None:
        self.kube_namespace = kube_namespace
        self._spec = spec
        if needs is not None:
            self.__dict__["needs"] = needs

    @functools.cached_property
    def needs(self) -> Needs:
        return Needs.from_spec(self._spec)

    @functools.cached_property
    def number(self) -> int:
        """The needs' number (:func:`_number`), for every claim it is checked against."""
        return _number("needs", self.needs.key())

    def wire(self) -> str | None:
        """This wake-up as another replica reads it back (:meth:`from_wire`): the kube
        namespace and the spec fields its needs come from, as compact JSON. None when it has no
        spec (needs given as they are) or its needs are too long to send."""
        if self._spec is None:
            return None
        spec = {k: self._spec[k] for k in NEEDS_FIELDS if self._spec.get(k)}
        try:
            text = json.dumps({"ns": self.kube_namespace, "spec": spec}, separators=(",", ":"))
        except (TypeError, ValueError, RecursionError):  # not JSON after all: sent as a bare count
            return None
        return text if len(text) <= WIRE_MAX else None

    @classmethod
    def from_wire(cls, text: str) -> LaunchWork | None:
        """The wake-up :meth:`wire` wrote; None for text it did not write (the wake then
        wakes any claim, as one that says nothing of its work)."""
        try:
            body = json.loads(text)
            if not (
                isinstance(body, dict)
                and isinstance(body.get("ns"), str)
                and isinstance(body.get("spec"), dict)
            ):
                return None
            work = cls(kube_namespace=body["ns"], spec=body["spec"])
            work.needs.key()  # read now: a claim asked about it must not meet a bad spec
        except (ValueError, TypeError, ArithmeticError, RecursionError):
            return None
        return work


def _offer_key(offer: NodeOffer) -> tuple[object, ...]:
    return (tuple(sorted(offer.labels.items())), offer.taints, tuple(sorted(offer.allocatable.items())))


class ClaimAccepts:
    """Whether a claim serving ``namespaces`` (none: every one) from a node with ``offer``
    (None: it sends none, and may take anything) may take a piece of work (called with it).

    Claims of one :attr:`group` (the same namespaces, nodes offering the same but for their
    names) answer alike for every launch that avoids no node: :meth:`group_may` answers for the
    whole group, so a wake for a launch no group may take passes a line of a thousand claims
    without asking each (:class:`nymph.queue.notify.WorkSignal`)."""

    __slots__ = ("_offer_number", "group", "offer", "served")

    def __init__(self, *, namespaces: Sequence[str], offer: NodeOffer | None) -> None:
        self.served = frozenset(namespaces)
        self.offer = offer
        self.group: tuple[object, ...] = (self.served, None if offer is None else _offer_key(offer))
        self._offer_number: int | None = None  # worked out at the first launch it is asked about

    def __call__(self, item: object) -> bool:
        if not isinstance(item, LaunchWork):
            return True
        if self.served and item.kube_namespace not in self.served:
            return False
        if self.offer is None:
            return True
        if item.needs.avoid:  # the node's name counts: judged for this node alone
            return misfit(item.needs, self.offer) is None
        return self._fits(item)

    def group_may(self, item: object) -> bool:
        """False only when no claim of this group may take ``item``."""
        if not isinstance(item, LaunchWork):
            return True
        if self.served and item.kube_namespace not in self.served:
            return False
        if self.offer is None or item.needs.avoid:  # avoided nodes: each claim answers for its own
            return True
        return self._fits(item)

    def _fits(self, item: LaunchWork) -> bool:
        if self._offer_number is None:
            self._offer_number = _number("offer", self.group[1])
        key = (self._offer_number, item.number)
        fits = _JUDGED.get(key)
        if fits is None:
            assert self.offer is not None
            fits = misfit(item.needs, self.offer) is None
            if len(_JUDGED) >= _MAX:
                _JUDGED.clear()
            _JUDGED[key] = fits
        return fits


def claim_accepts(*, namespaces: Sequence[str], offer: NodeOffer | None) -> ClaimAccepts:
    """The check a waiting claim's ticket carries (:class:`ClaimAccepts`)."""
    return ClaimAccepts(namespaces=namespaces, offer=offer)
