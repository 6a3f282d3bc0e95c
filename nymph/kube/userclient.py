"""The API client of a checked user-supplied kubeconfig (see :mod:`nymph.kube.userconfig`): the
client configuration built from the checked fields alone, the client certificate and key in a
private temp dir removed before the client is returned, every connection held to the server
policy."""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import ssl
import tempfile

import aiohttp
from kubernetes_asyncio import client

from nymph.errors import CredentialsError
from nymph.kube.netguard import ConnectGuard, ServerPolicy
from nymph.kube.userconfig import UserKubeconfig


def _write_private(directory: str, name: str, data: bytes) -> str:
    path = os.path.join(directory, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return path


def ssl_context(kc: UserKubeconfig, *, tmp_root: str | None = None) -> ssl.SSLContext:
    """The TLS context for ``kc``: its CA (as data) or the system's, its client certificate and
    key (through 0600 files in a private 0700 directory, removed before this returns)."""
    cluster = kc.cluster
    try:
        ctx = ssl.create_default_context(cadata=_ca_text(cluster.ca_data) if cluster.ca_data else None)
    except (ssl.SSLError, ValueError):
        raise CredentialsError("kubeconfig: certificate-authority-data is not a certificate") from None
    if kc.auth.cert_data is not None and kc.auth.key_data is not None:
        tmp = tempfile.mkdtemp(prefix="nymph-kube-", dir=tmp_root)  # 0700
        try:
            cert = _write_private(tmp, "client.crt", kc.auth.cert_data)
            key = _write_private(tmp, "client.key", kc.auth.key_data)
            try:
                ctx.load_cert_chain(cert, keyfile=key)
            except (ssl.SSLError, ValueError):
                raise CredentialsError(
                    "kubeconfig: client-certificate-data and client-key-data are not a certificate and its key"
                ) from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if cluster.insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _ca_text(data: bytes) -> str | bytes:
    """PEM as text (``cadata`` wants str for PEM, bytes for DER)."""
    with contextlib.suppress(UnicodeDecodeError):
        text = data.decode("ascii")
        if "-----BEGIN" in text:
            return text
    return data


def configuration(kc: UserKubeconfig, *, pool: int | None = None) -> client.Configuration:
    """The client configuration of ``kc`` (no file names: TLS is set up by :func:`ssl_context`)."""
    cfg = client.Configuration()
    cfg.host = kc.cluster.server
    cfg.verify_ssl = not kc.cluster.insecure
    cfg.tls_server_name = kc.cluster.tls_server_name
    auth = kc.auth
    if auth.token:
        cfg.api_key["BearerToken"] = f"Bearer {auth.token}"
    elif auth.username is not None and auth.password is not None:
        pair = f"{auth.username}:{auth.password}".encode()
        cfg.api_key["BearerToken"] = "Basic " + base64.b64encode(pair).decode("ascii")
    if pool is not None:
        cfg.connection_pool_maxsize = pool
    return cfg


async def build_client(
    kc: UserKubeconfig,
    *,
    servers: ServerPolicy,
    tmp_root: str | None = None,
    pool: int | None = None,
) -> client.ApiClient:
    """An ``ApiClient`` for a checked user-supplied kubeconfig whose every connection is held to
    ``servers``; an IP-literal server that may not be reached is refused before any connection.
    Call it from a coroutine (the session needs the running loop)."""
    servers.check_literal(kc.cluster.host)
    tls = ssl_context(kc, tmp_root=tmp_root) if kc.cluster.server.startswith("https") else None
    cfg = configuration(kc, pool=pool)
    api = client.ApiClient(configuration=cfg)
    rest = api.rest_client
    old: aiohttp.ClientSession = rest.pool_manager
    guard = ConnectGuard(policy=servers)
    connector = aiohttp.TCPConnector(
        limit=cfg.connection_pool_maxsize,
        ssl=tls if tls is not None else True,
        resolver=guard.resolver(),
        socket_factory=guard.socket_factory,
    )
    # No proxy from the environment either: the guard must see where the queue connects.
    rest.pool_manager = aiohttp.ClientSession(connector=connector, trust_env=False, read_bufsize=2**21)
    await old.close()
    return api


__all__ = ["build_client", "configuration", "ssl_context"]
