"""Nodes that serve no container log at all, remembered for a while so that the Pods on them
are not each asked for one.

The API server reads a container's log from the node's kubelet, at an address the Node
object lists. A node that lists none (a kwok node; a virtual kubelet that registers no
address) cannot serve the log of any Pod on it, so once one Pod's log request was answered
``no preferred addresses``, its log follower records the node here, and for
:attr:`LoglessNodes.ttl` seconds the followers of the other Pods on that node end at once with
the same note instead of sending a request each. After that the next Pod asks again, so a node
that gains an address is followed again. An error that may pass (a kubelet restarting: connection
refused, a timeout) is never remembered: it ends only the log of the Pod that met it.

Keys are opaque strings: the daemon uses its node's name; the queue, which reaches several
clusters, prefixes the connection's key.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

#: How long a node stays known to serve no log before a Pod on it asks again.
DEFAULT_TTL = 300.0
#: The most nodes kept; the oldest is forgotten first.
DEFAULT_MAX_NODES = 10_000


@dataclass
class LoglessNodes:
    ttl: float = DEFAULT_TTL
    max_nodes: int = DEFAULT_MAX_NODES
    clock: Callable[[], float] = time.monotonic
    _seen: dict[str, tuple[float, str]] = field(default_factory=dict)

    def known(self, node: str) -> str | None:
        """Why the node serves no log (what its last answer said), or None: ask it."""
        got = self._seen.get(node)
        if got is None:
            return None
        if self.clock() - got[0] >= self.ttl:
            del self._seen[node]
            return None
        return got[1]

    def remember(self, node: str, why: str) -> bool:
        """Record that ``node`` served no log because ``why``; True if it was not known yet."""
        new = self.known(node) is None
        self._seen.pop(node, None)  # re-inserted last: the dict's order is the age order
        self._seen[node] = (self.clock(), why)
        while len(self._seen) > self.max_nodes:
            del self._seen[next(iter(self._seen))]
        return new
