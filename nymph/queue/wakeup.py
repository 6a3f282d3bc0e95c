"""What a wake-up for new work is for, and whether a waiting claim may take it.

A new launch wakes only the waiting claims whose daemon serves its kube namespace and whose
node could run it if nothing else ran there (:func:`nymph.launch.placement.misfit` against the
node's offer): a launch only a few nodes can run does not wake, one claim after another, every
daemon of a thousand-node cluster. The test is a necessary condition only (what is placed on
the node, quotas and shares are the claim's to read), so it never keeps a wake from a claim
that could take the work; work of any other kind, and wakes relayed from other replicas, wake
any claim (:class:`nymph.queue.notify.WorkSignal`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from nymph.launch.placement import Needs, NodeOffer, misfit


@dataclass(frozen=True)
class LaunchWork:
    """A queued launch, as a wake-up carries it."""

    kube_namespace: str
    needs: Needs


def claim_accepts(*, namespaces: Sequence[str], offer: NodeOffer | None) -> Callable[[object], bool]:
    """Whether a claim serving ``namespaces`` (none: every one) from a node with ``offer``
    (None: it sends none, and may take anything) may take a piece of work."""
    served = frozenset(namespaces)

    def accepts(item: object) -> bool:
        if not isinstance(item, LaunchWork):
            return True
        if served and item.kube_namespace not in served:
            return False
        return offer is None or misfit(item.needs, offer) is None

    return accepts
