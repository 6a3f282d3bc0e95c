"""Which node may run a launch (pure): node selectors, taints and tolerations, resource requests.

A daemon pins each Pod to its own node, so the queue hands a launch only to a daemon whose node
offers what the launch needs (:func:`misfit` says why not):

* every ``node_selector`` pair is one of the node's labels;
* every ``NoSchedule`` / ``NoExecute`` taint of the node is tolerated (the Kubernetes rules: an
  empty toleration key with ``Exists`` matches every taint, ``Exists`` ignores the value,
  ``Equal`` (the default) compares it, an empty effect matches every effect);
* the node's free capacity (allocatable minus the requests already placed there) covers the
  launch's requests (a resource with a limit and no request requests its limit).

Quantities follow the Kubernetes grammar (``500m``, ``4Gi``, ``1.5``, ``2e3``, ``128974848``)
and are held exactly as :class:`fractions.Fraction`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

#: Taint effects that keep a Pod off a node (PreferNoSchedule only discourages).
BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_QUANTITY = re.compile(
    r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$"
)
_MAX_EXPONENT = 30


class QuantityError(ValueError):
    """A value that is not a Kubernetes quantity."""


def parse_quantity(value: object) -> Fraction:
    """``"500m"`` -> 1/2, ``"1Gi"`` -> 1073741824, ``"1e3"`` -> 1000, ``2`` -> 2 (exact)."""
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is not a quantity")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise QuantityError(f"{value!r} is not a quantity")
        return Fraction(str(value))
    if not isinstance(value, str):
        raise QuantityError(f"{value!r} is not a quantity")
    m = _QUANTITY.match(value.strip())
    if m is None:
        raise QuantityError(f"{value!r} is not a quantity, e.g. '500m', '4Gi', '2'")
    number, exponent, suffix = m.group(1), m.group(2), m.group(3) or ""
    base = Fraction(number)
    if exponent is not None:
        power = int(exponent[1:])
        if abs(power) > _MAX_EXPONENT:
            raise QuantityError(f"{value!r}: exponent out of range")
        return base * Fraction(10) ** power
    if suffix in _BINARY:
        return base * _BINARY[suffix]
    return base * _DECIMAL[suffix]


def format_quantity(value: Fraction, *, resource: str = "") -> str:
    """A readable quantity: fractions in m/u/n units, bytes in Gi/Mi/Ki when exact."""
    if value.denominator != 1:
        for suffix in ("m", "u", "n"):
            scaled = value / _DECIMAL[suffix]
            if scaled.denominator == 1:
                return f"{scaled.numerator}{suffix}"
        return f"{float(value):g}"
    if resource in ("memory", "ephemeral-storage") or resource.startswith("hugepages-"):
        for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
            unit = _BINARY[suffix]
            if value >= unit and (value / unit).denominator == 1:
                return f"{value / unit}{suffix}"
    return str(value.numerator)


@dataclass(frozen=True)
class Taint:
    key: str
    effect: str
    value: str = ""

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


@dataclass(frozen=True)
class NodeOffer:
    """What a node offers: its labels, taints and allocatable resources."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    allocatable: Mapping[str, Fraction] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "labels": dict(self.labels),
            "taints": [{"key": t.key, "value": t.value, "effect": t.effect} for t in self.taints],
            "allocatable": {k: format_quantity(v, resource=k) for k, v in sorted(self.allocatable.items())},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NodeOffer:
        """Raises ValueError (a :class:`QuantityError` for a bad quantity) on a malformed offer."""
        if not isinstance(data, Mapping):
            raise ValueError("a node offer must be a mapping")
        labels, taints, allocatable = (data.get(k) for k in ("labels", "taints", "allocatable"))
        labels = {} if labels is None else labels
        taints = [] if taints is None else taints
        allocatable = {} if allocatable is None else allocatable
        if (
            not isinstance(labels, Mapping)
            or not isinstance(taints, list)
            or not isinstance(allocatable, Mapping)
        ):
            raise ValueError("labels and allocatable must be mappings, taints a list")
        return cls(
            name=str(data.get("name") or ""),
            labels={str(k): str(v) for k, v in labels.items()},
            taints=tuple(taint_from_json(t) for t in taints),
            allocatable={str(k): parse_quantity(v) for k, v in allocatable.items()},
        )


def taint_from_json(data: object) -> Taint:
    if not isinstance(data, Mapping) or not isinstance(data.get("key"), str):
        raise ValueError(f"{data!r} is not a taint")
    return Taint(key=data["key"], value=str(data.get("value") or ""), effect=str(data.get("effect") or ""))


def node_offer(node: Mapping[str, Any]) -> NodeOffer:
    """A Node object (as the API server returns it, as a dict) -> its offer."""
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    allocatable: dict[str, Fraction] = {}
    for k, v in (status.get("allocatable") or {}).items():
        try:
            allocatable[str(k)] = parse_quantity(v)
        except QuantityError:
            continue
    return NodeOffer(
        name=str(meta.get("name") or ""),
        labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
        taints=tuple(taint_from_json(t) for t in spec.get("taints") or ()),
        allocatable=allocatable,
    )


def tolerates(toleration: Mapping[str, Any], taint: Taint) -> bool:
    """The Kubernetes toleration rule for one toleration and one taint."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.effect:
        return False
    key = toleration.get("key") or ""
    operator = toleration.get("operator") or "Equal"
    if not key:
        return operator == "Exists"
    if key != taint.key:
        return False
    if operator == "Exists":
        return True
    if operator == "Equal":
        return str(toleration.get("value") or "") == taint.value
    return False


def untolerated(tolerations: Sequence[Mapping[str, Any]], taints: Iterable[Taint]) -> list[Taint]:
    """The node's blocking taints that none of ``tolerations`` tolerates."""
    return [
        t
        for t in taints
        if t.effect in BLOCKING_EFFECTS and not any(tolerates(tol, t) for tol in tolerations)
    ]


def requests_of(resources: Mapping[str, Any] | None) -> dict[str, Fraction]:
    """A container's effective requests: its requests, and its limits where it requests nothing.
    Unparseable quantities are left out (the API server refuses the Pod itself)."""
    out: dict[str, Fraction] = {}
    if not isinstance(resources, Mapping):
        return out
    for section in ("limits", "requests"):  # requests win over limits
        values = resources.get(section)
        if not isinstance(values, Mapping):
            continue
        for k, v in values.items():
            try:
                out[str(k)] = parse_quantity(v)
            except QuantityError:
                continue
    return out


@dataclass(frozen=True)
class Needs:
    """What a launch asks of its node."""

    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Mapping[str, Any], ...] = ()
    requests: Mapping[str, Fraction] = field(default_factory=dict)
    #: Nodes it turned out Unschedulable on (the queue moved it off them).
    avoid: tuple[str, ...] = ()

    @property
    def requests_something(self) -> bool:
        """Whether it requests any resource: only then does what is placed on a node matter
        to :func:`misfit`."""
        return any(v > 0 for v in self.requests.values())

    def key(self) -> tuple[Any, ...]:
        """Equal for needs that are equal (its tolerations and requests in a set order), and
        hashable: launches with the same needs share one judgement against the same offers."""
        return (
            self.node_selector,
            tuple(tuple(sorted((str(k), repr(v)) for k, v in t.items())) for t in self.tolerations),
            tuple(sorted(self.requests.items())),
            self.avoid,
        )

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any] | None) -> Needs:
        """From a launch spec's JSON (:meth:`nymph.launch.spec.LaunchSpec.to_json`)."""
        if not isinstance(spec, Mapping):
            return cls()
        selector = spec.get("nodeSelector") or ()
        tolerations = spec.get("tolerations") or ()
        return cls(
            node_selector=tuple(
                (str(p[0]), str(p[1])) for p in selector if isinstance(p, (list, tuple)) and len(p) == 2
            ),
            tolerations=tuple(t for t in tolerations if isinstance(t, Mapping)),
            requests=requests_of(spec.get("resources")),
            avoid=tuple(str(n) for n in spec.get("avoidNodes") or () if isinstance(n, str)),
        )


def add(total: Mapping[str, Fraction], more: Mapping[str, Fraction]) -> dict[str, Fraction]:
    out = dict(total)
    for k, v in more.items():
        out[k] = out.get(k, Fraction(0)) + v
    return out


def selector_text(selector: Sequence[tuple[str, str]]) -> str:
    return ",".join(f"{k}={v}" for k, v in selector)


def misfit(needs: Needs, offer: NodeOffer, *, used: Mapping[str, Fraction] | None = None) -> str | None:
    """None if ``offer``'s node can run the launch now; else why not (one short phrase).

    ``used`` are the requests already placed on the node. A resource the node does not list as
    allocatable is not available there (requesting ``0`` of it is fine)."""
    if offer.name and offer.name in needs.avoid:
        return f"it was Unschedulable on node {offer.name}"
    missing = [(k, v) for k, v in needs.node_selector if offer.labels.get(k) != v]
    if missing:
        return f"node_selector {selector_text(missing)} does not match"
    bad = untolerated(needs.tolerations, offer.taints)
    if bad:
        return f"taint {bad[0]} is not tolerated"
    used = used or {}
    for resource, amount in sorted(needs.requests.items()):
        if amount <= 0:
            continue
        free = offer.allocatable.get(resource, Fraction(0)) - used.get(resource, Fraction(0))
        if amount > free:
            return (
                f"{resource} request {format_quantity(amount, resource=resource)} exceeds the "
                f"{format_quantity(max(free, Fraction(0)), resource=resource)} free"
            )
    return None


def why_waiting(needs: Needs, offers: Sequence[tuple[NodeOffer, Mapping[str, Fraction]]]) -> str | None:
    """None if some offer (a live daemon's node, with what is placed on it) can run the launch;
    else why nobody can, naming the first check every node fails ("no daemon's node matches
    node_selector gpu=a100")."""
    if not offers:
        return "no live daemon serves this kube namespace"
    if any(misfit(needs, o, used=u) is None for o, u in offers):
        return None
    untried = [(o, u) for o, u in offers if o.name not in needs.avoid]
    if not untried:
        return f"it was Unschedulable on every daemon's node ({', '.join(needs.avoid)})"
    offers = untried
    if all(any(o.labels.get(k) != v for k, v in needs.node_selector) for o, _ in offers):
        return f"no daemon's node matches node_selector {selector_text(needs.node_selector)}"
    matching = [(o, u) for o, u in offers if all(o.labels.get(k) == v for k, v in needs.node_selector)]
    if all(untolerated(needs.tolerations, o.taints) for o, _ in matching):
        taints = sorted({str(t) for o, _ in matching for t in untolerated(needs.tolerations, o.taints)})
        return f"no daemon's node tolerates its taints (untolerated: {', '.join(taints[:4])})"
    fits_empty = [
        (o, u)
        for o, u in matching
        if not untolerated(needs.tolerations, o.taints) and misfit(needs, o) is None
    ]
    if not fits_empty:
        wanted = ", ".join(
            f"{k}={format_quantity(v, resource=k)}" for k, v in sorted(needs.requests.items()) if v > 0
        )
        return f"no daemon's node has the allocatable resources for requests {wanted}"
    return "waiting for free capacity on a matching node"


#: The kinds of :func:`why_waiting`'s reasons, by how each begins (the event stream tells a change
#: of kind, never one of its figures).
_WAITING_KINDS = (
    ("no live daemon serves", "NoDaemon"),
    ("it was Unschedulable on every", "UnschedulableEverywhere"),
    ("no daemon's node matches", "NodeSelector"),
    ("no daemon's node tolerates", "Taints"),
    ("no daemon's node has the allocatable", "Resources"),
    ("waiting for free capacity", "Capacity"),
)


def waiting_kind(reason: str | None) -> str | None:
    """The kind of a reason from :func:`why_waiting` (None for none: it waits its turn)."""
    if not reason:
        return None
    for start, kind in _WAITING_KINDS:
        if reason.startswith(start):
            return kind
    return "Other"
