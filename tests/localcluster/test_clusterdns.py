"""The local cluster DNS: Service names answer with their ready Pod addresses over real UDP,
other cluster names are NXDOMAIN, and the rest goes to an upstream resolver."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator, Sequence

import pytest

from nymph.localcluster.apierror import ApiAnswerError
from nymph.localcluster.clusterdns import (
    NXDOMAIN,
    SERVFAIL,
    ClusterDNS,
    endpoints_lookup,
    parse_query,
    ready_addresses,
    service_of,
)


def query(name: str, *, qtype: int = 1, qid: int = 0x1234) -> bytes:
    qname = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    return struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0) + qname + struct.pack("!HH", qtype, 1)


def addresses(reply: bytes) -> tuple[int, list[str]]:
    """(rcode, the A records' addresses) of a reply to one of :func:`query`'s packets."""
    _, flags, _, ancount = struct.unpack("!HHHH", reply[:8])
    parsed = parse_query(reply[:12].replace(reply[2:4], b"\x01\x00") + reply[12:])
    assert parsed is not None
    pos, found = parsed[4], []
    for _ in range(ancount):
        _, _, _, _, size = struct.unpack("!HHHIH", reply[pos : pos + 12])
        found.append(socket.inet_ntoa(reply[pos + 12 : pos + 12 + size]))
        pos += 12 + size
    return flags & 0xF, found


SERVICES = {("t-1", "grpo-head-svc"): ["10.213.0.5", "10.213.0.6"]}


def lookup(namespace: str, service: str) -> Sequence[str]:
    return SERVICES.get((namespace, service), [])


@pytest.fixture
def dns() -> Iterator[ClusterDNS]:
    server = ClusterDNS(listen="127.0.0.1", port=0, lookup=lookup, upstream=None).start()
    try:
        yield server
    finally:
        server.stop()


def ask(server: ClusterDNS, packet: bytes) -> bytes:
    assert server._sock is not None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(5)
        s.sendto(packet, server._sock.getsockname())
        return s.recvfrom(4096)[0]


def test_a_service_name_answers_with_its_ready_addresses_over_udp(dns: ClusterDNS) -> None:
    """The reply keeps the query's id and question and carries one A record per address."""
    reply = ask(dns, query("grpo-head-svc.t-1.svc.cluster.local"))
    assert reply[:2] == b"\x12\x34"
    assert addresses(reply) == (0, ["10.213.0.5", "10.213.0.6"])


def test_unknown_cluster_names_are_nxdomain_and_others_need_an_upstream(dns: ClusterDNS) -> None:
    """A search-path expansion or a missing Service is NXDOMAIN (the resolver tries the next
    name); a name outside the cluster with no upstream is SERVFAIL; AAAA gets no address."""
    for name in (
        "grpo-head-svc.t-1.svc.cluster.local.cluster.local",
        "nope.t-1.svc.cluster.local",
        "cluster.local",
    ):
        assert addresses(ask(dns, query(name)))[0] == NXDOMAIN, name
    assert addresses(ask(dns, query("example.org")))[0] == SERVFAIL
    assert addresses(ask(dns, query("grpo-head-svc.t-1.svc.cluster.local", qtype=28))) == (0, [])


def test_names_and_endpoints_parse() -> None:
    assert service_of("a.b.svc.cluster.local", domain="cluster.local") == ("b", "a")
    assert service_of("x.a.b.svc.cluster.local", domain="cluster.local") is None
    assert parse_query(b"\x00" * 5) is None
    eps = {
        "subsets": [
            {"addresses": [{"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}], "notReadyAddresses": [{"ip": "10.0.0.3"}]}
        ]
    }
    assert ready_addresses(eps) == ["10.0.0.1", "10.0.0.2"]
    assert ready_addresses({}) == []


def test_a_service_without_endpoints_has_no_address_and_other_api_errors_are_raised() -> None:
    """The API server's 404 for a Service's Endpoints is "no address"; any other error answer
    (or a down server) is not taken for one."""

    def answer(status: int) -> object:
        def api(method: str, path: str) -> object:
            raise ApiAnswerError(f"{method} {path}: HTTP {status}: no", status=status)

        return api

    assert endpoints_lookup(answer(404))("default", "web") == []
    with pytest.raises(ApiAnswerError, match="HTTP 403"):
        endpoints_lookup(answer(403))("default", "web")
