"""A small cluster DNS for the local real node: Service names resolve inside its Pods.

The local node has no kube-proxy, so a Service's ClusterIP routes nowhere; what does route is a
Pod IP on the node's bridge. So ``<service>.<namespace>.svc.<domain>`` answers with the ready
addresses of the Service's Endpoints, as a headless Service's name would (that is what Ray
workers need to find their head, and KubeRay's submitter Job its head's dashboard). Any other
name under the cluster domain is NXDOMAIN; a name outside it is relayed to the host's resolver
(the first ``nameserver`` of /etc/resolv.conf), so Pods resolve what the host resolves. Only
A queries are answered with addresses; other types of cluster names get an empty answer.

It listens on UDP ``<node IP>:53`` (kubelet's ``clusterDNS``), runs in a named daemon thread,
reads Endpoints through ``lookup`` (the admin API) on each query, and stops with the cluster.
Test infrastructure only: no caching, no TCP, no PTR, no SRV.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nymph.errors import NymphError
from nymph.localcluster.apierror import ApiAnswerError

TYPE_A = 1
CLASS_IN = 1
NOERROR, SERVFAIL, NXDOMAIN = 0, 2, 3
TTL = 5

Lookup = Callable[[str, str], Sequence[str]]  # (namespace, service) -> ready IPv4 addresses


def parse_query(packet: bytes) -> tuple[int, int, str, int, int] | None:
    """``(id, flags, name, qtype, end of the question)`` of a one-question query, else None."""
    if len(packet) < 12:
        return None
    qid, flags, qdcount = struct.unpack("!HHH", packet[:6])
    if qdcount != 1 or flags & 0x8000:
        return None
    labels: list[str] = []
    pos = 12
    while True:
        if pos >= len(packet):
            return None
        size = packet[pos]
        pos += 1
        if size == 0:
            break
        if size & 0xC0 or pos + size > len(packet):
            return None
        labels.append(packet[pos : pos + size].decode("ascii", errors="replace").lower())
        pos += size
    if pos + 4 > len(packet):
        return None
    qtype, _qclass = struct.unpack("!HH", packet[pos : pos + 4])
    return qid, flags, ".".join(labels), qtype, pos + 4


def answer(query: bytes, *, end: int, rcode: int, addresses: Sequence[str] = ()) -> bytes:
    """The response to ``query`` (its question kept) with ``addresses`` as A records."""
    qid, flags = struct.unpack("!HH", query[:4])
    out_flags = 0x8000 | 0x0400 | (flags & 0x0100) | 0x0080 | rcode  # QR, AA, RD echoed, RA
    header = struct.pack("!HHHHHH", qid, out_flags, 1, len(addresses), 0, 0)
    records = b"".join(
        struct.pack("!HHHIH", 0xC00C, TYPE_A, CLASS_IN, TTL, 4) + ipaddress.IPv4Address(a).packed
        for a in addresses
    )
    return header + query[12:end] + records


def service_of(name: str, *, domain: str) -> tuple[str, str] | None:
    """``(namespace, service)`` for ``<service>.<namespace>.svc.<domain>``, else None."""
    suffix = f".svc.{domain}"
    if not name.endswith(suffix):
        return None
    parts = name[: -len(suffix)].split(".")
    return (parts[1], parts[0]) if len(parts) == 2 and all(parts) else None


def host_resolver(resolv_conf: Path = Path("/etc/resolv.conf")) -> str | None:
    with contextlib.suppress(OSError):
        for line in resolv_conf.read_text().splitlines():
            words = line.split()
            if len(words) >= 2 and words[0] == "nameserver":
                with contextlib.suppress(ValueError):
                    if ipaddress.ip_address(words[1]).version == 4:
                        return words[1]
    return None


@dataclass
class ClusterDNS:
    listen: str
    lookup: Lookup
    domain: str = "cluster.local"
    port: int = 53
    upstream: str | None = field(default_factory=host_resolver)
    _sock: socket.socket | None = None
    _thread: threading.Thread | None = None

    def start(self) -> ClusterDNS:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((self.listen, self.port))
        sock.settimeout(0.5)
        self._sock = sock
        self._thread = threading.Thread(target=self._serve, name="cluster-dns", daemon=True)
        self._thread.start()
        return self

    def kubelet_settings(self) -> dict[str, object]:
        return {"clusterDNS": [self.listen], "clusterDomain": self.domain}

    def stop(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def _serve(self) -> None:
        while (sock := self._sock) is not None:
            try:
                packet, peer = sock.recvfrom(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            reply = self.respond(packet)
            if reply is not None:
                with contextlib.suppress(OSError):
                    sock.sendto(reply, peer)

    def respond(self, packet: bytes) -> bytes | None:
        """The reply to one query packet (None: not a query to answer)."""
        parsed = parse_query(packet)
        if parsed is None:
            return None
        _, _, name, qtype, end = parsed
        if name == self.domain or name.endswith(f".{self.domain}"):
            target = service_of(name, domain=self.domain)
            if target is None:
                return answer(packet, end=end, rcode=NXDOMAIN)
            try:
                addresses = list(self.lookup(*target))
            except (NymphError, OSError, ValueError):  # the API server is down: try again
                return answer(packet, end=end, rcode=SERVFAIL)
            if not addresses:
                return answer(packet, end=end, rcode=NXDOMAIN)
            return answer(packet, end=end, rcode=NOERROR, addresses=addresses if qtype == TYPE_A else ())
        return self._relay(packet, end=end)

    def _relay(self, packet: bytes, *, end: int) -> bytes:
        if self.upstream is None:
            return answer(packet, end=end, rcode=SERVFAIL)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as up:
            up.settimeout(2.0)
            try:
                up.sendto(packet, (self.upstream, 53))
                return up.recvfrom(4096)[0]
            except OSError:
                return answer(packet, end=end, rcode=SERVFAIL)


def ready_addresses(endpoints: object) -> list[str]:
    """The ready IPv4 addresses of a v1 Endpoints object."""
    out: list[str] = []
    subsets = endpoints.get("subsets") if isinstance(endpoints, dict) else None
    for subset in subsets or []:
        for addr in (subset.get("addresses") or []) if isinstance(subset, dict) else []:
            ip = addr.get("ip") if isinstance(addr, dict) else None
            if isinstance(ip, str) and ip not in out:
                out.append(ip)
    return out


def endpoints_lookup(api: Callable[[str, str], object]) -> Lookup:
    """A :data:`Lookup` reading Endpoints with ``api(method, path)`` (the cluster's admin API)."""

    def lookup(namespace: str, service: str) -> list[str]:
        try:
            return ready_addresses(api("GET", f"/api/v1/namespaces/{namespace}/endpoints/{service}"))
        except ApiAnswerError as exc:
            if exc.status == 404:
                return []
            raise

    return lookup
