"""Nodes known to serve no container log: which answers make a node known, for how long, and
that a follower for a Pod on such a node ends with the node's note without a request."""

from __future__ import annotations

from typing import Any

import pytest

from nymph.kube.logfollow import follow_container_log
from nymph.kube.loglessnodes import LoglessNodes
from nymph.kube.logstream import NoContainerLog, NodeHasNoAddress, classify
from nymph.launch.logcursor import Cursor
from tests.support.fakeclock import FakeClock

NO_ADDRESS = "no preferred addresses found; known addresses: []"


def test_a_node_is_known_until_its_time_runs_out() -> None:
    """A remembered node is known (with what its answer said) for ``ttl`` seconds, then asked
    again; remembering it again restarts its time."""
    clock = FakeClock(1000.0)
    nodes = LoglessNodes(ttl=60, clock=clock)
    assert nodes.known("n1") is None
    assert nodes.remember("n1", NO_ADDRESS) is True
    assert nodes.remember("n1", NO_ADDRESS) is False  # a second follower that raced the first
    clock.now += 59.9
    assert nodes.known("n1") == NO_ADDRESS
    assert nodes.known("n2") is None
    clock.now += 0.1
    assert nodes.known("n1") is None
    assert nodes.remember("n1", "said again") is True
    clock.now += 59
    assert nodes.known("n1") == "said again"


def test_the_oldest_node_is_forgotten_first_when_full() -> None:
    """At most ``max_nodes`` are kept; a node remembered again counts as the newest."""
    nodes = LoglessNodes(max_nodes=2, clock=FakeClock(1000.0))
    nodes.remember("a", "x")
    nodes.remember("b", "x")
    nodes.remember("a", "x")  # a is now newer than b
    nodes.remember("c", "x")
    assert [n for n in ("a", "b", "c") if nodes.known(n)] == ["a", "c"]


@pytest.mark.parametrize(
    ("status", "said", "node_wide"),
    [
        (400, NO_ADDRESS, True),
        (500, "Get https://10.0.0.7:10250/...: dial tcp 10.0.0.7:10250: connect: connection refused", False),
        (502, "i/o timeout", False),
        (404, "404 page not found", False),
    ],
)
def test_only_a_node_without_an_address_counts_for_every_pod_on_it(
    status: int, said: str, node_wide: bool
) -> None:
    """A node that lists no address serves no Pod's log; a refused connection or a timeout may
    pass (a kubelet restarting) and ends only the log of the Pod that met it."""
    err = classify(status, "no log", said=said)
    assert isinstance(err, NoContainerLog)
    assert isinstance(err, NodeHasNoAddress) is node_wide
    assert err.message == "no log"  # only the Status message is carried on


class Sink:
    def __init__(self) -> None:
        self.shipped: list[dict[str, Any]] = []

    async def room(self) -> None:
        return None

    async def ship(self, *, offset: int, data: bytes, cursor: Cursor, final: bool, note: str | None) -> None:
        self.shipped.append({"offset": offset, "data": data, "final": final, "note": note})


class NoApi:
    """Stands where the API client goes: any use of it fails the test."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the API client was used ({name})")


async def test_a_follower_on_a_known_node_ends_at_once_with_its_note() -> None:
    """On a node known to serve no log the follower ships one final, empty chunk with the
    node's note and sends no request; on another node it would ask (and here fail loudly)."""
    nodes = LoglessNodes(clock=FakeClock(1000.0))
    nodes.remember("kwok-1", NO_ADDRESS)
    sink = Sink()
    await follow_container_log(
        NoApi(),  # type: ignore[arg-type]
        namespace="ns",
        name="p1",
        cursor=Cursor(),
        sink=sink,
        ended=lambda: False,
        node="kwok-1",
        logless=nodes,
    )
    assert sink.shipped == [
        {"offset": 0, "data": b"", "final": True, "note": f"no container log: {NO_ADDRESS}"}
    ]
    with pytest.raises(AssertionError, match="API client was used"):
        await follow_container_log(
            NoApi(),  # type: ignore[arg-type]
            namespace="ns",
            name="p2",
            cursor=Cursor(),
            sink=Sink(),
            ended=lambda: False,
            node="kwok-2",
            logless=nodes,
        )
