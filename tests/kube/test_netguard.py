"""Where a user-supplied kubeconfig may make the queue connect: the address rules, and a real
client against real local listeners (a refused server never sees a connection; what a server
answers is relayed only as a Kubernetes Status message)."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from nymph.kube.api import MESSAGE_LIMIT, api_error, status_error
from nymph.kube.errors import Conflict, Unavailable
from nymph.kube.netguard import HostAddresses, ServerNotAllowed, ServerPolicy, as_ipv4, special_kind
from nymph.kube.pods import list_pods
from nymph.kube.userclient import build_client
from nymph.kube.userconfig import check_user_kubeconfig

PLANTED = "PLANTED-BODY-SECRET-7f3a"

KUBECONFIG = """apiVersion: v1
kind: Config
current-context: c
contexts: [{name: c, context: {cluster: k, user: u}}]
clusters: [{name: k, cluster: {server: "%s"}}]
users: [{name: u, user: {token: t0ken-value}}]
"""


def ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


@pytest.mark.parametrize(
    "addr",
    [
        "127.0.0.1",
        "127.3.2.1",
        "::1",
        "::ffff:127.0.0.1",
        "::127.0.0.1",
        "0.0.0.0",
        "0.1.2.3",
        "::",
        "169.254.169.254",
        "169.254.1.1",
        "fe80::1",
        "::ffff:169.254.169.254",
        "fd00:ec2::254",
        "100.100.100.200",
        "224.0.0.1",
    ],
)
def test_never_by_default(addr: str) -> None:
    assert special_kind(ip(addr)) is not None
    assert ServerPolicy().refusal(ip(addr), host=addr) is not None


@pytest.mark.parametrize(
    "addr", ["10.0.0.1", "192.168.1.10", "172.16.0.5", "8.8.8.8", "2001:db8::1", "fd12::1"]
)
def test_ordinary_addresses_are_allowed_by_default(addr: str) -> None:
    policy = ServerPolicy(own_addresses=HostAddresses(ttl=1e9, _at=1e18))  # this host: none
    assert policy.refusal(ip(addr), host=addr) is None


def test_the_hosts_own_addresses_are_refused_by_default() -> None:
    own = HostAddresses()
    policy = ServerPolicy(own_addresses=own)
    for addr in own.get():
        err = policy.refusal(addr, host=str(addr))
        assert err is not None and "--kube-server-allow" in err.message


@given(st.ip_addresses(v=4))
def test_an_ipv4_address_is_judged_the_same_written_as_ipv6(v4: ipaddress.IPv4Address) -> None:
    mapped = ipaddress.IPv6Address(f"::ffff:{v4}")
    assert as_ipv4(mapped) == v4
    assert special_kind(mapped) == special_kind(v4)


@given(st.ip_addresses(network="127.0.0.0/8") | st.ip_addresses(network="169.254.0.0/16"))
def test_every_loopback_and_link_local_address_is_refused(addr: ipaddress.IPv4Address) -> None:
    assert special_kind(addr) is not None
    assert special_kind(ipaddress.IPv6Address(f"::ffff:{addr}")) is not None


@given(st.ip_addresses(network="10.0.0.0/8"))
def test_an_allow_list_is_the_only_rule(addr: ipaddress.IPv4Address) -> None:
    policy = ServerPolicy.from_allow(["10.1.0.0/16", "127.0.0.1", "kube.example.test"])
    allowed = addr in ipaddress.ip_network("10.1.0.0/16")
    assert (policy.refusal(addr, host=str(addr)) is None) is allowed
    assert policy.refusal(ip("127.0.0.1"), host="127.0.0.1") is None  # listed: loopback too
    assert policy.refusal(ip("127.0.0.2"), host="127.0.0.2") is not None
    assert policy.name_allowed("KUBE.example.test.")


@pytest.mark.parametrize("entry", ["", "a b", "10.0.0.0/33", "user@host", "[::1"])
def test_malformed_allow_entries_are_refused(entry: str) -> None:
    with pytest.raises(ValueError, match="--kube-server-allow"):
        ServerPolicy.from_allow([entry])


# --- a real client against real listeners -------------------------------------------------------


@dataclass
class Listener:
    port: int
    seen: list[str] = field(default_factory=list)


@pytest.fixture
async def listener() -> AsyncIterator[Listener]:
    """An HTTP server on loopback that answers a non-Kubernetes body carrying a planted secret
    (or a redirect, or a Kubernetes Status), and records every request it sees."""
    state = Listener(port=0)

    async def handle(request: web.Request) -> web.StreamResponse:
        state.seen.append(request.path)
        if request.path.startswith("/redirect/"):
            raise web.HTTPFound(f"http://{request.path.split('/')[2]}:{state.port}/api/v1/namespaces/x/pods")
        if request.path.startswith("/status/"):
            body = {"kind": "Status", "apiVersion": "v1", "code": 409, "message": "x" * 2000}
            return web.json_response(body, status=409)
        return web.Response(status=500, text=f"internal: {PLANTED}", reason=f"Oops {PLANTED}")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    state.port = runner.addresses[0][1]
    try:
        yield state
    finally:
        await runner.cleanup()


async def _call(server: str, policy: ServerPolicy) -> Exception:
    kc = check_user_kubeconfig(KUBECONFIG % server, what="(inline)")
    try:
        api = await build_client(kc, servers=policy)
    except ServerNotAllowed as exc:
        return exc
    try:
        await list_pods(api, namespace="x", selector="a=b")
    except Exception as exc:
        return exc
    finally:
        await api.close()
    raise AssertionError("the call succeeded")


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::ffff:127.0.0.1]"])
async def test_loopback_servers_are_refused_before_any_connection(listener: Listener, host: str) -> None:
    err = await _call(f"http://{host}:{listener.port}", ServerPolicy())
    assert isinstance(err, ServerNotAllowed), err
    assert "--kube-server-allow" in err.message and "loopback" in err.message
    assert listener.seen == []


async def test_a_name_not_on_the_allow_list_is_refused(listener: Listener) -> None:
    err = await _call(f"http://localhost:{listener.port}", ServerPolicy.from_allow(["10.0.0.0/8"]))
    assert isinstance(err, ServerNotAllowed) and "--kube-server-allow localhost" in err.message
    assert listener.seen == []


async def test_an_allowed_server_is_reached_and_its_body_is_not_echoed(listener: Listener) -> None:
    err = await _call(f"http://127.0.0.1:{listener.port}", ServerPolicy.from_allow(["127.0.0.1"]))
    assert listener.seen == ["/api/v1/namespaces/x/pods"]
    assert isinstance(err, Unavailable) and err.message == "the server answered HTTP 500"
    assert PLANTED not in str(err)


async def test_a_redirect_to_a_refused_address_makes_no_connection(listener: Listener) -> None:
    """aiohttp follows redirects and resolves no IP literal: every socket is checked itself."""
    err = await _call(
        f"http://127.0.0.1:{listener.port}/redirect/127.0.0.2", ServerPolicy.from_allow(["127.0.0.1"])
    )
    assert isinstance(api_error(err), ServerNotAllowed), err
    assert listener.seen == ["/redirect/127.0.0.2/api/v1/namespaces/x/pods"]


async def test_a_status_message_is_relayed_cut_short(listener: Listener) -> None:
    err = await _call(f"http://127.0.0.1:{listener.port}/status", ServerPolicy.from_allow(["127.0.0.1"]))
    assert isinstance(err, Conflict) and len(err.message) == MESSAGE_LIMIT


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (json.dumps({"kind": "Status", "message": "pods is forbidden"}), "pods is forbidden"),
        (json.dumps({"message": PLANTED}), "the server answered HTTP 403"),
        (json.dumps({"kind": "Status", "message": 3}), "the server answered HTTP 403"),
        (f"<html>{PLANTED}</html>", "the server answered HTTP 403"),
        (None, "the server answered HTTP 403"),
    ],
)
def test_status_error_relays_only_a_status_message(body: str | None, expected: str) -> None:
    assert status_error(403, f"Forbidden {PLANTED}", body).message == expected
