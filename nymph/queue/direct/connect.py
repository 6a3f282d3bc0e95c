"""Connections of direct providers: checked when a provider or mode is saved (inline kubeconfig
checked against the allow-list of user-supplied kubeconfigs and moved into the secret store, a
``$secret`` checked the same way, paths held to the directories serving the team, ``dispatch:
daemon`` refusing connection kwargs), and opened for a call with secrets read from the store
only (checked again at every load: a secret can change after the provider was saved)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections.abc import AsyncIterator, Awaitable, Iterable, Mapping
from typing import Any

from kubernetes_asyncio import client

from nymph.errors import ConfigError, CredentialsError
from nymph.kube.clientcache import ClientCache
from nymph.kube.credentials import SECRET_NAME, allowed_path, check_kubeconfig_text, looks_like_path
from nymph.kube.netguard import ServerNotAllowed
from nymph.kube.pods import Connection, load_api
from nymph.kube.userconfig import check_user_fields
from nymph.launch.config import Mode, Provider, check_dispatch_kwargs
from nymph.queue.direct.errors import service_error
from nymph.queue.direct.settings import DirectSettings
from nymph.queue.errors import BadRequest, NotFound
from nymph.queue.models import Principal
from nymph.queue.secrets import FetchedSecrets
from nymph.queue.secretstore import SecretStore


def inline_secret_name(kind: str, name: str) -> str:
    """The store name an inline kubeconfig of provider/mode ``name`` is moved to."""
    slug = re.sub(r"[^A-Za-z0-9._-]", "-", name).strip("-._") or "x"
    out = f"{kind}.{slug}.kubeconfig"
    if slug != name or not SECRET_NAME.match(out):
        out = f"{kind}.{slug[:200]}.{hashlib.sha256(name.encode()).hexdigest()[:8]}.kubeconfig"
    return out


class Connector:
    def __init__(self, *, secrets: SecretStore, settings: DirectSettings) -> None:
        self.secrets = secrets
        self.settings = settings
        self.clients = ClientCache()
        #: A connection's fingerprint for the secret values it was made from (see
        #: :meth:`_fingerprint`): a kubeconfig is hashed once per value read, not at every call.
        self._prints: dict[str, tuple[tuple[tuple[str, str], ...], str]] = {}

    def check_user_text(self, text: str, *, what: str) -> None:
        """Refuse a user-supplied kubeconfig that carries a field outside the allow-list, or
        names an IP-literal server this queue may not reach (a name is checked when connecting)."""
        policy = self.settings.policy
        try:
            hosts = check_user_fields(text, what=what, allow_insecure=policy.allow_insecure_tls)
            for host in hosts:
                policy.servers.check_literal(host)
        except CredentialsError as exc:
            raise BadRequest(str(exc), code="invalid_kubeconfig") from None
        except ServerNotAllowed as exc:
            raise service_error(exc, what="checking a kubeconfig") from None

    async def check_secret(self, *, ns: str, name: str, value: str, configs: Iterable[object]) -> None:
        """Before secret ``name`` of ``ns`` is set: when a provider's or mode's kwargs (``configs``)
        use it as their kubeconfig, its new value must pass the same checks as inline content."""
        ref = {"$secret": name}
        if any(isinstance(c, Mapping) and c.get("kubeconfig") == ref for c in configs):
            self.check_user_text(value, what=f"(secret {name})")

    async def prepare(
        self, *, ns: str, kind: str, name: str, kwargs: Mapping[str, Any], principal: Principal | None = None
    ) -> dict[str, Any]:
        """Kwargs as stored: an inline kubeconfig becomes a ``$secret`` ref (its content in the
        store, checked against the allow-list), a ``$secret`` already set is checked the same
        way, a path must be readable under the directories serving ``ns`` (the bare ones only
        for a token not scoped to a namespace; ``principal`` None: as such a token)."""
        out = dict(kwargs)
        ref = out.get("kubeconfig")
        if ref in (None, ""):
            return out
        if isinstance(ref, str) and looks_like_path(ref):
            bare = principal is None or principal.namespace is None
            try:
                allowed_path(ref, policy=self.settings.policy, namespace=ns, bare=bare)
            except CredentialsError as exc:
                raise BadRequest(str(exc), code="kubeconfig_path_refused") from None
            return out
        if isinstance(ref, Mapping):
            if (
                set(ref) != {"$secret"}
                or not isinstance(ref["$secret"], str)
                or not SECRET_NAME.match(ref["$secret"])
            ):
                raise BadRequest(
                    'kwargs.kubeconfig: a secret reference is exactly {"$secret": NAME}',
                    code="invalid_kubeconfig",
                )
            secret = ref["$secret"]
            try:
                value = await self.secrets.plaintext(ns=ns, name=secret)
            except NotFound:
                return out  # set later: checked then, and at every load
            self.check_user_text(value, what=f"(secret {secret})")
            return out
        if not isinstance(ref, str):
            raise BadRequest(
                'kwargs.kubeconfig must be a path, inline content or {"$secret": NAME}',
                code="invalid_kubeconfig",
            )
        try:
            check_kubeconfig_text(ref, what=f"(inline, kwargs of {kind} {name!r})")
        except CredentialsError as exc:
            raise BadRequest(str(exc), code="invalid_kubeconfig") from None
        self.check_user_text(ref, what=f"(inline, kwargs of {kind} {name!r})")
        secret = inline_secret_name(kind, name)
        await self.secrets.put(ns=ns, name=secret, value=ref)
        out["kubeconfig"] = {"$secret": secret}
        return out

    async def prepare_provider(
        self, *, ns: str, provider: Provider, principal: Principal | None = None
    ) -> Provider:
        try:
            check_dispatch_kwargs(provider)
        except ConfigError as exc:
            raise BadRequest(str(exc), code="invalid_provider") from None
        kwargs = await self.prepare(
            ns=ns, kind="provider", name=provider.name, kwargs=provider.kwargs, principal=principal
        )
        return Provider(
            name=provider.name, kwargs=kwargs, launcher=provider.launcher, dispatch=provider.dispatch
        )

    async def prepare_mode(self, *, ns: str, mode: Mode, principal: Principal | None = None) -> Mode:
        fields = await self.prepare(
            ns=ns, kind="mode", name=mode.name, kwargs=mode.fields, principal=principal
        )
        return Mode(name=mode.name, provider=mode.provider, fields=fields)

    async def _resolver(self, *, ns: str, conn: Connection) -> FetchedSecrets:
        values: dict[str, str] = {}
        ref = conn.kubeconfig
        if isinstance(ref, Mapping) and isinstance(ref.get("$secret"), str):
            name = ref["$secret"]
            # a missing one: the resolver says which secret is missing, and how to create it
            with contextlib.suppress(NotFound):
                values[name] = await self.secrets.plaintext(
                    ns=ns, name=name, max_age=self.settings.secret_reread
                )
        return FetchedSecrets(values=values, namespace=ns)

    def _fingerprint(self, *, key: str, conn: Connection, resolver: FetchedSecrets) -> str:
        """Changes when the credential behind ``conn`` does: the secret's content, or the
        kubeconfig file's identity and times (a hash, held in memory only). ``key``: the
        connection's key in :attr:`clients`."""
        ref = conn.kubeconfig
        by_path = isinstance(ref, str) and looks_like_path(ref)
        values = tuple(sorted(resolver.values.items()))
        if not by_path:
            known = self._prints.get(key)
            if known is not None and known[0] == values:
                return known[1]
        h = hashlib.sha256(key.encode())
        for name, value in values:
            h.update(b"\0" + name.encode() + b"\0" + value.encode())
        if by_path:
            assert isinstance(ref, str)
            try:
                st = os.stat(os.path.realpath(os.path.expanduser(ref)))
                h.update(f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}".encode())
            except (OSError, ValueError):  # ValueError: a NUL byte
                h.update(b"missing")  # opening it says why
            return h.hexdigest()
        if len(self._prints) >= 1024:
            self._prints.clear()
        self._prints[key] = (values, h.hexdigest())
        return self._prints[key][1]

    @contextlib.asynccontextmanager
    async def api(self, *, ns: str, conn: Connection, what: str) -> AsyncIterator[client.ApiClient]:
        """An API client for ``conn`` on behalf of control-plane namespace ``ns`` (kept open for
        the next call while its credential is unchanged); a failure to load it is the queue's
        HTTP error for ``what``."""
        if isinstance(conn.kubeconfig, str) and not looks_like_path(conn.kubeconfig):
            raise BadRequest(
                "kubeconfig content is never stored: store it as a secret", code="invalid_kubeconfig"
            )
        try:
            resolver = await self._resolver(ns=ns, conn=conn)

            def opener() -> Awaitable[client.ApiClient]:
                # no limit on connections: each live log stream holds one for the Pod's life
                return load_api(
                    conn,
                    resolver=resolver,
                    policy=self.settings.policy,
                    tmp_root=self.settings.tmp_root,
                    pool=0,
                    namespace=ns,
                )

            key = json.dumps([ns, conn.key()])
            fingerprint = self._fingerprint(key=key, conn=conn, resolver=resolver)
            used = self.clients.use(key, fingerprint, opener)
            api = await used.__aenter__()
        except Exception as exc:
            raise service_error(exc, what=what) from None
        try:
            yield api
        finally:
            await used.__aexit__(None, None, None)

    async def sweep(self) -> None:
        """Close the clients nobody used for a while."""
        await self.clients.sweep()

    async def close(self) -> None:
        await self.clients.close()
