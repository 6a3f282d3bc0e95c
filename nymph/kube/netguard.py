"""Where a user-supplied kubeconfig may make the queue connect.

A kubeconfig a user hands the queue (inline or as a secret) names a ``server``; without a
guard the queue would connect wherever it says, and relay what answered: its own loopback
services, the cloud metadata endpoint, anything on its network. A :class:`ServerPolicy` says
what is allowed:

* with an allow-list (``queue serve --kube-server-allow HOST|CIDR``): only the hosts named
  there and the addresses inside the networks listed;
* without one: anything except loopback, link-local (the metadata endpoint 169.254.169.254
  among them), unspecified (``0.0.0.0``, ``::``), multicast, the known metadata addresses and
  the queue host's own addresses.

The check is made on the addresses actually connected to: :class:`GuardResolver` checks what a
name resolves to (a name that resolves to ``127.0.0.1``, ``::1``, ``::ffff:127.0.0.1`` or
``0.0.0.0`` is loopback too), and :meth:`ConnectGuard.socket_factory` checks the address of
every socket before it connects (aiohttp does not resolve an IP-literal host, nor the
target of a redirect given as one). An IPv4 address written as IPv6 (``::ffff:a.b.c.d``,
``::a.b.c.d``) is judged as the IPv4 address. Operator-placed (path) kubeconfigs and the
queue's own credentials are not guarded.
"""

from __future__ import annotations

import ipaddress
import itertools
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from nymph.kube.errors import KubeError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

ALLOW_FLAG = "--kube-server-allow"

#: Cloud metadata endpoints outside link-local (AWS IPv6, Alibaba Cloud).
METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(
    {ipaddress.ip_address("fd00:ec2::254"), ipaddress.ip_address("100.100.100.200")}
)
_THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")


class ServerNotAllowed(KubeError):
    """A user-supplied kubeconfig named a server this queue may not connect to."""


class _RefusedSocket(OSError):
    """Raised inside aiohttp's connect path (which only passes OSErrors on); carries the refusal."""

    def __init__(self, refusal: ServerNotAllowed) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


def refusal_of(exc: BaseException) -> ServerNotAllowed | None:
    """The :class:`ServerNotAllowed` behind an exception aiohttp raised, if that is what it is."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        cur = todo.pop()
        if cur is None or id(cur) in seen:
            continue
        seen.add(id(cur))
        if isinstance(cur, ServerNotAllowed):
            return cur
        if isinstance(cur, _RefusedSocket):
            return cur.refusal
        todo += [cur.__cause__, cur.__context__, getattr(cur, "os_error", None)]
    return None


def parse_address(text: str) -> IPAddress | None:
    """``text`` as an IP address (brackets and an IPv6 zone dropped), else None."""
    raw = text.strip().strip("[]").split("%", 1)[0]
    try:
        return ipaddress.ip_address(raw)
    except ValueError:
        return None


def as_ipv4(ip: IPAddress) -> IPAddress:
    """An IPv4 address written as IPv6 (mapped or compatible) as the IPv4 address it is."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if int(ip) >> 32 == 0 and int(ip) > 1:  # ::a.b.c.d (deprecated "compatible" form)
            return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip


def special_kind(ip: IPAddress) -> str | None:
    """Why ``ip`` is never a user's API server by default (None: it may be)."""
    ip = as_ipv4(ip)
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_unspecified or (isinstance(ip, ipaddress.IPv4Address) and ip in _THIS_NETWORK):
        return "an unspecified address (it reaches this host)"
    if ip in METADATA_ADDRESSES:
        return "a cloud metadata address"
    if ip.is_link_local:
        return "a link-local address (the cloud metadata endpoint lives there)"
    if ip.is_multicast:
        return "a multicast address"
    return None


def _proc_addresses() -> set[IPAddress]:
    """This host's interface addresses, where Linux lists them."""
    out: set[IPAddress] = set()
    try:
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            hexaddr = line.split()[0] if line.split() else ""
            if len(hexaddr) == 32:
                out.add(ipaddress.IPv6Address(int(hexaddr, 16)))
    except (OSError, ValueError):
        pass
    try:
        lines = Path("/proc/net/fib_trie").read_text().splitlines()
    except OSError:
        lines = []
    for prev, line in itertools.pairwise(lines):
        if "/32 host LOCAL" in line:
            ip = parse_address(prev.strip().lstrip("|-+ ").strip())
            if ip is not None:
                out.add(ip)
    return out


def _hostname_addresses() -> set[IPAddress]:
    out: set[IPAddress] = set()
    for name in {socket.gethostname(), socket.getfqdn()}:
        try:
            infos = socket.getaddrinfo(name, None)
        except OSError:
            continue
        for info in infos:
            ip = parse_address(str(info[4][0]))
            if ip is not None:
                out.add(ip)
    return out


@dataclass
class HostAddresses:
    """The queue host's own addresses, looked up again after ``ttl`` seconds."""

    ttl: float = 60.0
    _at: float = -1e18
    _addresses: frozenset[IPAddress] = frozenset()

    def get(self) -> frozenset[IPAddress]:
        now = time.monotonic()
        if now - self._at >= self.ttl:
            found = _proc_addresses() | _hostname_addresses()
            self._addresses = frozenset(as_ipv4(ip) for ip in found)
            self._at = now
        return self._addresses


HOST_ADDRESSES = HostAddresses()


def _norm_host(host: str) -> str:
    return host.strip().strip("[]").rstrip(".").lower()


@dataclass(frozen=True)
class ServerPolicy:
    """Where a user-supplied kubeconfig may connect: ``names`` and ``networks`` from the
    operator's allow-list (both empty: the default rules, :data:`DEFAULT_SERVERS`)."""

    names: frozenset[str] = frozenset()
    networks: tuple[IPNetwork, ...] = ()
    own_addresses: HostAddresses = field(default_factory=lambda: HOST_ADDRESSES, compare=False, repr=False)

    @classmethod
    def from_allow(cls, entries: Iterable[str]) -> ServerPolicy:
        """From ``--kube-server-allow`` values (a host name, an IP address or a CIDR each);
        :class:`ValueError` names a malformed one."""
        names: set[str] = set()
        nets: list[IPNetwork] = []
        for entry in entries:
            text = entry.strip()
            if not text:
                raise ValueError(f"{ALLOW_FLAG}: an empty entry")
            if text.startswith("[") != text.endswith("]"):
                raise ValueError(f"{ALLOW_FLAG} {text}: unbalanced brackets")
            if "/" in text or parse_address(text) is not None:
                try:
                    nets.append(ipaddress.ip_network(text.strip("[]"), strict=False))
                except ValueError:
                    raise ValueError(f"{ALLOW_FLAG} {text}: not an IP address or CIDR") from None
                continue
            host = _norm_host(text)
            if not host or any(c in host for c in ":@ ") or len(host) > 253:
                raise ValueError(f"{ALLOW_FLAG} {text}: not a host name, IP address or CIDR")
            names.add(host)
        return cls(names=frozenset(names), networks=tuple(nets))

    @property
    def restricted(self) -> bool:
        """True when the operator gave an allow-list (only it counts)."""
        return bool(self.names or self.networks)

    def name_allowed(self, host: str) -> bool:
        """True when ``host`` is a name the allow-list names (then whatever it resolves to is
        allowed: the operator named it)."""
        return _norm_host(host) in self.names

    def refusal(self, ip: IPAddress, *, host: str) -> ServerNotAllowed | None:
        """Why connecting to ``ip`` (for server ``host``) is refused; None when it is allowed."""
        shown = host if parse_address(host) == ip else f"{host} ({ip})"
        if self.restricted:
            if self.name_allowed(host):
                return None
            if any(as_ipv4(ip) in net or ip in net for net in self.networks):
                return None
            return ServerNotAllowed(
                f"kubeconfig server {shown} is not among the servers this queue lets a "
                f"user-supplied kubeconfig reach; the operator allows it with "
                f"'nymph queue serve {ALLOW_FLAG} {host}'",
                status=403,
            )
        kind = special_kind(ip)
        if kind is None and as_ipv4(ip) in self.own_addresses.get():
            kind = "one of the queue host's own addresses"
        if kind is None:
            return None
        return ServerNotAllowed(
            f"kubeconfig server {shown} is {kind}: a user-supplied kubeconfig may not make the "
            "queue connect to its own host, loopback, link-local or metadata addresses; the "
            f"operator allows a server with 'nymph queue serve {ALLOW_FLAG} HOST|CIDR'",
            status=403,
        )

    def check_literal(self, host: str) -> None:
        """Refuse ``host`` now when it is an IP literal that may not be reached, or (with an
        allow-list) a name or address the list does not name; a name is checked again on
        every connection, on what it resolves to."""
        ip = parse_address(host)
        if ip is not None:
            err = self.refusal(ip, host=host)
            if err is not None:
                raise err


#: No allow-list: anything but loopback, link-local, unspecified, metadata and this host.
DEFAULT_SERVERS = ServerPolicy()


@dataclass
class ConnectGuard:
    """One client's guard: its resolver and socket factory share the addresses a name the
    allow-list names resolved to."""

    policy: ServerPolicy
    _by_name: set[str] = field(default_factory=set)

    def remember(self, ip: IPAddress) -> None:
        """``ip`` is what a name the allow-list names resolved to: sockets may connect to it."""
        self._by_name.add(str(as_ipv4(ip)))

    def check(self, ip: IPAddress, *, host: str) -> None:
        if str(as_ipv4(ip)) in self._by_name:
            return
        err = self.policy.refusal(ip, host=host)
        if err is not None:
            raise err

    def resolver(self) -> GuardResolver:
        return GuardResolver(self)

    def socket_factory(self, addr_info: Any) -> socket.socket:
        """Every socket the client opens: refused before it connects to a forbidden address."""
        family, type_, proto, _, sockaddr = addr_info
        ip = parse_address(str(sockaddr[0]))
        if ip is None:
            raise _RefusedSocket(ServerNotAllowed("kubeconfig server: not an IP address", status=403))
        try:
            self.check(ip, host=str(sockaddr[0]))
        except ServerNotAllowed as err:
            raise _RefusedSocket(err) from None
        return socket.socket(family=family, type=type_, proto=proto)


class GuardResolver(AbstractResolver):
    """Resolves as aiohttp does, then refuses a name any of whose addresses is not allowed."""

    def __init__(self, guard: ConnectGuard) -> None:
        self._guard = guard
        self._inner = DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        by_name = self._guard.policy.name_allowed(host)
        for r in results:
            ip = parse_address(str(r["host"]))
            if ip is None:
                raise ServerNotAllowed(f"kubeconfig server {host}: resolved to no IP address", status=403)
            if by_name:
                self._guard.remember(ip)
                continue
            self._guard.check(ip, host=host)
        return results

    async def close(self) -> None:
        await self._inner.close()


__all__ = [
    "ALLOW_FLAG",
    "DEFAULT_SERVERS",
    "ConnectGuard",
    "GuardResolver",
    "HostAddresses",
    "ServerNotAllowed",
    "ServerPolicy",
    "as_ipv4",
    "parse_address",
    "refusal_of",
    "special_kind",
]
