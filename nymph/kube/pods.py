"""Pods through the API server with a provider's own connection (kubernetes_asyncio).

:func:`open_api` turns a :class:`Connection` (a kubeconfig ref, a context, a namespace) into an
``ApiClient``. A user-supplied kubeconfig (inline or ``$secret``) is checked against the
allow-list of :mod:`nymph.kube.userconfig` and built into a client there, every connection held
to the operator's server policy; a path kubeconfig (the operator's) is loaded with kubectl's
semantics, its certificate files written in a private temp directory (0700) that is removed
before the client is handed out, also when loading fails. Then: create (adopting a Pod that
already exists under the fixed name), list by labels, read, delete (``False`` when already gone),
logs, a server-side dry run and an RBAC self-check. Every failure is a
:class:`~nymph.kube.errors.KubeError` carrying the API server's message.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client, config
from kubernetes_asyncio.config.config_exception import ConfigException

from nymph.errors import CredentialsError
from nymph.kube import rawcall
from nymph.kube.api import api_error, forget_loader_files, raw_json, without_env_lookups
from nymph.kube.credentials import (
    OPEN_POLICY,
    SECRET_NAME,
    CredentialPolicy,
    SecretResolver,
    default_resolver,
    describe,
    looks_like_path,
    staged_kubeconfig,
)
from nymph.kube.errors import AlreadyExists, NotFound
from nymph.kube.userclient import build_client
from nymph.kube.userconfig import check_user_kubeconfig
from nymph.logsetup import forget_secret, register_secret

#: A provider without a kubeconfig on a host whose own credentials do not load.
NO_HOST_CREDENTIALS = (
    "this provider names no kubeconfig, and the queue host has no credentials of its own that "
    "load (no in-cluster ServiceAccount, KUBECONFIG or ~/.kube/config): add one to the provider "
    "('--kwarg kubeconfig=PATH' or '--kwarg kubeconfig={\"$secret\": NAME}' after nymph secrets set "
    "NAME --from-file FILE), or use '--dispatch daemon' to have the nymph daemon in the cluster "
    "create its Pods"
)

#: The accesses the direct path needs in the provider's namespace.
REQUIRED_ACCESS: tuple[tuple[str, str, str], ...] = (
    ("create", "pods", ""),
    ("get", "pods", ""),
    ("list", "pods", ""),
    ("watch", "pods", ""),
    ("delete", "pods", ""),
    ("get", "pods", "log"),
)


@dataclass(frozen=True)
class Connection:
    """How to reach a cluster: a kubeconfig ref (a path or ``{"$secret": NAME}``; ``None`` for
    the host's own), a context and the namespace Pods go to."""

    kubeconfig: Any = None
    context: str | None = None
    namespace: str = "default"

    def key(self) -> str:
        """Equal for connections that reach the same cluster the same way (never the secret)."""
        return json.dumps([self.kubeconfig, self.context, self.namespace], sort_keys=True)

    def describe(self) -> str:
        ctx = f", context {self.context}" if self.context else ""
        return f"kubeconfig {describe(self.kubeconfig)}{ctx}, namespace {self.namespace}"

    def to_json(self) -> dict[str, Any]:
        return {"kubeconfig": self.kubeconfig, "context": self.context, "namespace": self.namespace}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Connection:
        return cls(
            kubeconfig=data.get("kubeconfig"),
            context=data.get("context") or None,
            namespace=str(data.get("namespace") or "default"),
        )


async def _load(path: str | None, *, conn: Connection, tmp: str, pool: int | None) -> client.ApiClient:
    cfg = client.Configuration()
    if path is None and not conn.context and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    else:
        await config.load_kube_config(
            config_file=path, context=conn.context, client_configuration=cfg, temp_file_path=tmp
        )
    if pool is not None:
        cfg.connection_pool_maxsize = pool
    return without_env_lookups(client.ApiClient(configuration=cfg))


def _user_text(ref: object, *, resolver: SecretResolver | None) -> tuple[str, str] | None:
    """``(plaintext, what)`` of a user-supplied kubeconfig ref (inline or ``$secret``), else None."""
    if isinstance(ref, Mapping):
        if set(ref) != {"$secret"}:
            raise CredentialsError('kubeconfig: a secret reference is exactly {"$secret": NAME}')
        name = ref["$secret"]
        if not isinstance(name, str) or not SECRET_NAME.match(name):
            raise CredentialsError("kubeconfig: $secret must name a secret (letters, digits, '.', '_', '-')")
        return (resolver or default_resolver()).resolve(name), f"(secret {name})"
    if isinstance(ref, str) and ref and not looks_like_path(ref):
        return ref, "(inline)"
    return None


async def load_api(
    conn: Connection,
    *,
    resolver: SecretResolver | None = None,
    policy: CredentialPolicy = OPEN_POLICY,
    tmp_root: str | None = None,
    pool: int | None = None,
    namespace: str | None = None,
) -> client.ApiClient:
    """An ``ApiClient`` for ``conn`` that the caller closes; every staged file is gone before it
    is returned. ``pool``: the most connections it opens at once (0: no limit; None: the
    client's default of 100). ``namespace``: the control-plane namespace it is opened for (a
    path kubeconfig must be in a directory serving it, or in a bare one).

    A user-supplied kubeconfig (inline or ``$secret``) is checked against the allow-list each
    time and built into a client here, held to ``policy.servers``; a path kubeconfig (the
    operator's) and the host's own credentials go through kubernetes_asyncio's loader."""
    user = _user_text(conn.kubeconfig, resolver=resolver)
    if user is not None:
        text, what = user
        register_secret(text)
        try:
            checked = check_user_kubeconfig(
                text, what=what, context=conn.context, allow_insecure=policy.allow_insecure_tls
            )
            return await build_client(checked, servers=policy.servers, tmp_root=tmp_root, pool=pool)
        finally:
            forget_secret(text)
    tmp = tempfile.mkdtemp(prefix="nymph-kube-", dir=tmp_root)
    try:
        with staged_kubeconfig(
            conn.kubeconfig,
            resolver=resolver,
            tmpdir=tmp,
            policy=policy,
            context=conn.context,
            namespace=namespace,
        ) as path:
            try:
                return await _load(path, conn=conn, tmp=tmp, pool=pool)
            except (ConfigException, OSError, ValueError, KeyError, TypeError) as exc:
                if path is None:  # the host's own credentials, and it has none that load
                    raise CredentialsError(NO_HOST_CREDENTIALS + f" ({exc.__class__.__name__})") from None
                raise CredentialsError(
                    f"{conn.describe()}: cannot be loaded as a kubeconfig ({exc.__class__.__name__})"
                ) from None
    finally:
        forget_loader_files(tmp)
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.asynccontextmanager
async def open_api(
    conn: Connection,
    *,
    resolver: SecretResolver | None = None,
    policy: CredentialPolicy = OPEN_POLICY,
    tmp_root: str | None = None,
    namespace: str | None = None,
) -> AsyncIterator[client.ApiClient]:
    """An ``ApiClient`` for ``conn`` for the block; every staged file is gone before it is yielded."""
    api = await load_api(conn, resolver=resolver, policy=policy, tmp_root=tmp_root, namespace=namespace)
    try:
        yield api
    finally:
        await api.close()


def _pod(data: dict[str, Any]) -> dict[str, Any]:
    data.setdefault("apiVersion", "v1")
    data.setdefault("kind", "Pod")
    return data


async def create_pod(api: client.ApiClient, manifest: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """Create the Pod; ``(pod, created)``. A Pod already there under its fixed name is adopted."""
    meta = manifest["metadata"]
    try:
        return _pod(
            await raw_json(rawcall.send(api, "POST", rawcall.pod_path(meta["namespace"]), body=manifest))
        ), True
    except AlreadyExists:
        pass
    return await read_pod(api, namespace=meta["namespace"], name=meta["name"]), False


async def dry_run_pod(api: client.ApiClient, manifest: Mapping[str, Any]) -> dict[str, Any]:
    """A server-side dry run of creating the Pod (admission, quota and validation included)."""
    v1 = client.CoreV1Api(api)
    body: Any = dict(manifest)
    call = v1.create_namespaced_pod(
        manifest["metadata"]["namespace"], body, dry_run="All", _preload_content=False
    )
    return _pod(await raw_json(call))


async def read_pod(api: client.ApiClient, *, namespace: str, name: str) -> dict[str, Any]:
    v1 = client.CoreV1Api(api)
    return _pod(await raw_json(v1.read_namespaced_pod(name, namespace, _preload_content=False)))


async def list_pods(api: client.ApiClient, *, namespace: str, selector: str) -> list[dict[str, Any]]:
    v1 = client.CoreV1Api(api)
    data = await raw_json(v1.list_namespaced_pod(namespace, label_selector=selector, _preload_content=False))
    return [_pod(p) for p in data.get("items") or []]


async def delete_pod(api: client.ApiClient, *, namespace: str, name: str, grace_seconds: int | None) -> bool:
    """Delete the Pod; ``False`` when it was already gone."""
    v1 = client.CoreV1Api(api)
    kwargs: dict[str, Any] = {}
    if grace_seconds is not None:
        kwargs["grace_period_seconds"] = grace_seconds
    try:
        await v1.delete_namespaced_pod(name, namespace, **kwargs)
    except Exception as exc:
        err = api_error(exc)
        if isinstance(err, NotFound):
            return False
        raise err from None
    return True


async def pod_logs(api: client.ApiClient, *, namespace: str, name: str, limit_bytes: int) -> str:
    v1 = client.CoreV1Api(api)
    try:
        text = await v1.read_namespaced_pod_log(name, namespace, container="user", tail_lines=5000)
    except Exception as exc:
        raise api_error(exc) from None
    return str(text)[-limit_bytes:]


@dataclass(frozen=True)
class AccessCheck:
    verb: str
    resource: str
    allowed: bool
    reason: str = ""

    @property
    def name(self) -> str:
        return f"{self.verb} {self.resource}"


async def check_access(
    api: client.ApiClient,
    *,
    namespace: str,
    accesses: Sequence[tuple[str, str, str]] = REQUIRED_ACCESS,
) -> list[AccessCheck]:
    """Ask the API server (SelfSubjectAccessReview) whether this identity may do each access."""
    authz = client.AuthorizationV1Api(api)
    out: list[AccessCheck] = []
    for verb, resource, sub in accesses:
        attrs: dict[str, Any] = {"namespace": namespace, "verb": verb, "resource": resource}
        if sub:
            attrs["subresource"] = sub
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attrs},
        }
        try:
            review = await authz.create_self_subject_access_review(body)  # type: ignore[arg-type]
        except Exception as exc:
            raise api_error(exc) from None
        status = api.sanitize_for_serialization(review).get("status") or {}
        name = f"{resource}/{sub}" if sub else resource
        out.append(
            AccessCheck(
                verb=verb,
                resource=name,
                allowed=bool(status.get("allowed")),
                reason=str(status.get("reason") or ""),
            )
        )
    return out


__all__ = [
    "REQUIRED_ACCESS",
    "AccessCheck",
    "AlreadyExists",
    "Connection",
    "check_access",
    "create_pod",
    "delete_pod",
    "dry_run_pod",
    "list_pods",
    "load_api",
    "open_api",
    "pod_logs",
    "read_pod",
]
