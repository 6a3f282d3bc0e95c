"""Direct API access with kubernetes_asyncio: client construction and the ``api`` applier."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import urllib.request
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config import kube_config

from nymph import fastjson
from nymph.errors import ValidationError
from nymph.kube import rawcall
from nymph.kube.applier import ApplyOutcome, object_key
from nymph.kube.errors import Conflict, Invalid, KubeError, NotFound, Unavailable, from_status
from nymph.kube.kubectl import FIELD_MANAGER
from nymph.kube.netguard import refusal_of
from nymph.launch.names import LABEL_MANAGED, check_dns_subdomain, check_namespace


def forget_loader_files(directory: str) -> None:
    """The loader caches the paths of the certificate files it wrote, by content; drop the
    entries under ``directory`` so a later load writes fresh files instead of reusing gone ones."""
    cache: dict[str, str] = kube_config._temp_files
    for key in [k for k, v in cache.items() if v.startswith(directory + os.sep)]:
        del cache[key]


async def make_api_client(*, kubeconfig: str | None = None, context: str | None = None) -> client.ApiClient:
    """In-cluster ServiceAccount first (when no kubeconfig is given), then KUBECONFIG / ~/.kube/config.

    The loader writes a kubeconfig's certificate and key data to files; here they go to a private
    directory removed once the client holds its TLS context, so a process that is killed never
    leaves a client key behind in the temp dir (the loader itself removes them only at exit)."""
    cfg = client.Configuration()
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        return without_env_lookups(client.ApiClient(configuration=cfg))
    tmp = tempfile.mkdtemp(prefix="nymph-kube-")  # 0700
    try:
        await config.load_kube_config(
            config_file=kubeconfig, context=context, client_configuration=cfg, temp_file_path=tmp
        )
        return without_env_lookups(client.ApiClient(configuration=cfg))
    finally:
        forget_loader_files(tmp)
        shutil.rmtree(tmp, ignore_errors=True)


#: The most characters of an API server's Status message relayed.
MESSAGE_LIMIT = 500


def status_error(status: int, reason: str | None, body: str | bytes | None) -> KubeError:
    """The KubeError for an API server answer ``status``: its Status ``message`` (cut to
    :data:`MESSAGE_LIMIT`) when the body is a Kubernetes Status, else only "the server answered
    HTTP N". Nothing else of the answer (its reason phrase, any other body) is kept: a server a
    kubeconfig names may be anything, and its text is relayed to users."""
    del reason  # the server's own words; not relayed
    return from_status(status, status_message(status, body))


def status_message(status: int, body: str | bytes | None) -> str:
    """What may be relayed of an answer: its Kubernetes Status ``message`` (cut to
    :data:`MESSAGE_LIMIT`), else "the server answered HTTP N"."""
    message = f"the server answered HTTP {status}"
    try:
        decoded = json.loads(body or "{}")
    except (ValueError, TypeError):
        decoded = None
    if isinstance(decoded, dict) and decoded.get("kind") == "Status":
        said = decoded.get("message")
        if isinstance(said, str) and said.strip():
            said = said.strip()
            message = said if len(said) <= MESSAGE_LIMIT else said[: MESSAGE_LIMIT - 3] + "..."
    return message


def api_error(exc: BaseException) -> KubeError:
    """Classify an exception from kubernetes_asyncio / aiohttp into a KubeError (a server the
    guard refused stays that refusal). No text the server sent is echoed."""
    refused = refusal_of(exc)
    if refused is not None:
        return refused
    if isinstance(exc, KubeError):
        return exc
    if isinstance(exc, ApiException):
        return status_error(int(exc.status or 0), exc.reason, exc.body)
    if isinstance(exc, aiohttp.ClientConnectorError):
        # host, port and the OS's (or TLS's) reason: nothing the server sent
        os_error = getattr(exc, "os_error", None)
        why = getattr(os_error, "strerror", None) or exc.__class__.__name__
        return Unavailable(f"cannot connect to {exc.host}:{exc.port} ({why})")
    return Unavailable(
        f"the API server could not be reached or gave no usable answer ({exc.__class__.__name__})"
    )


async def raw_json(call: Awaitable[Any]) -> dict[str, Any]:
    """The JSON answer of a kubernetes_asyncio call made with ``_preload_content=False`` (no
    client model is built only to be turned back into JSON); a refusal is a KubeError."""
    try:
        resp: Any = await call
        try:
            raw = await resp.read()
        finally:
            resp.release()
    except KubeError:
        raise
    except Exception as exc:
        raise api_error(exc) from None
    if not 200 <= resp.status <= 299:
        raise status_error(resp.status, resp.reason, raw)
    try:
        data = fastjson.loads(raw)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise Unavailable("the API server answered with something other than an object")
    return data


def without_env_lookups(api: client.ApiClient) -> client.ApiClient:
    """Stop the client's HTTP session from looking up proxies and ~/.netrc on every request
    (two thread hops per call) when the environment sets neither: the session is rebuilt on the
    same connection pool, without ``trust_env``. Call it from a coroutine (the session needs
    the running loop)."""
    netrc = os.environ.get("NETRC") or os.path.expanduser("~/.netrc")
    if urllib.request.getproxies() or os.path.exists(netrc):
        return api
    rest = api.rest_client
    old: aiohttp.ClientSession = rest.pool_manager
    rest.pool_manager = aiohttp.ClientSession(connector=old.connector, trust_env=False, read_bufsize=2**21)
    old.detach()
    return api


@dataclass
class ApiApplier:
    api: client.ApiClient
    name: str = "api"

    async def apply(
        self, manifests: Sequence[Mapping[str, Any]], *, dry_run: bool = False
    ) -> list[ApplyOutcome]:
        """Create each Pod, all of them at once (the daemon's concurrency bounds how many it hands
        over): one outcome per manifest, in order. A create, not a server-side apply: a Pod's
        spec cannot change, so there is nothing to merge, and a create costs the API server
        less. A Pod that exists already answers AlreadyExists, which the daemon adopts when it
        is the same launch (as it does for kubectl's apply)."""
        return list(await asyncio.gather(*(self._apply_one(m, dry_run=dry_run) for m in manifests)))

    async def _apply_one(self, m: Mapping[str, Any], *, dry_run: bool) -> ApplyOutcome:
        ns, name = object_key(m)
        if m.get("kind") != "Pod":
            return ApplyOutcome(namespace=ns, name=name, error=KubeError("the api applier only applies Pods"))
        query = [("fieldManager", FIELD_MANAGER)]
        if dry_run:
            query.append(("dryRun", "All"))
        try:
            # The manifest encoded once and the answer read raw (no client model either way).
            resp = await rawcall.send(self.api, "POST", rawcall.pod_path(ns), query=query, body=m)
            try:
                raw = await resp.read()
            finally:
                resp.release()
        except Exception as exc:
            return ApplyOutcome(namespace=ns, name=name, error=api_error(exc))
        if 200 <= resp.status <= 299:
            return ApplyOutcome(namespace=ns, name=name, body=raw)  # decoded only if read
        return ApplyOutcome(namespace=ns, name=name, error=status_error(resp.status, resp.reason, raw))

    async def delete_pod(
        self, *, namespace: str, name: str, grace_seconds: int | None, uid: str | None = None
    ) -> bool:
        """Delete the nymph Pod ``name``, as the kubectl applier does: only a Pod that carries
        nymph's label, and only the one read (a uid precondition), so a Pod nymph did not
        create, or one that replaced it meanwhile, is never deleted. False when there is none.

        With ``uid`` (the Pod as the daemon's watch of nymph's Pods last saw it, label and all)
        the Pod is not read first: the delete carries that uid as its precondition, so only
        that Pod goes, and a Pod that has taken its name since is left (False)."""
        try:
            check_namespace(namespace)
            check_dns_subdomain(name, field="name")
        except ValidationError as exc:
            raise Invalid(f"refusing to delete a Pod: {exc}") from None
        v1 = client.CoreV1Api(self.api)
        try:
            if uid is None:
                uid = await self._nymph_pod_uid(v1, namespace=namespace, name=name)
                if uid is None:
                    return False
            body: Any = {"preconditions": {"uid": uid}}
            if grace_seconds is not None:
                body["gracePeriodSeconds"] = grace_seconds
            # Raw again: the answer (the Pod, or a Status) is not needed, only whether it worked.
            deleted: Any = await v1.delete_namespaced_pod(name, namespace, body=body, _preload_content=False)
            try:
                answer = await deleted.read()
            finally:
                deleted.release()
            if not 200 <= deleted.status <= 299:
                raise status_error(deleted.status, deleted.reason, answer)
        except KubeError as err:
            if isinstance(err, NotFound | Conflict):
                return False  # gone, or replaced by another Pod since it was read
            raise
        except Exception as exc:
            error = api_error(exc)
            if isinstance(error, NotFound | Conflict):
                return False
            raise error from exc
        return True

    @staticmethod
    async def _nymph_pod_uid(v1: client.CoreV1Api, *, namespace: str, name: str) -> str | None:
        """The uid of the Pod ``name`` if it carries nymph's label (None if it does not)."""
        # Read raw: deserializing a V1Pod would load dozens of model classes for two fields.
        pod = await raw_json(v1.read_namespaced_pod(name, namespace, _preload_content=False))
        meta = pod.get("metadata") or {}
        if (meta.get("labels") or {}).get(LABEL_MANAGED) != "true":
            return None
        return str(meta.get("uid") or "") or None

    async def pod_logs(self, *, namespace: str, name: str, limit_bytes: int) -> str:
        v1 = client.CoreV1Api(self.api)
        try:
            text = await v1.read_namespaced_pod_log(name, namespace, container="user", tail_lines=5000)
        except Exception as exc:
            raise api_error(exc) from exc
        return str(text)[-limit_bytes:]

    async def can_i(self, *, verb: str, resource: str, namespace: str) -> bool:
        """A SelfSubjectAccessReview, as ``kubectl auth can-i`` makes one; False when it fails."""
        body = client.V1SelfSubjectAccessReview(
            spec=client.V1SelfSubjectAccessReviewSpec(
                resource_attributes=client.V1ResourceAttributes(
                    verb=verb, resource=resource, namespace=namespace
                )
            )
        )
        try:
            review = await client.AuthorizationV1Api(self.api).create_self_subject_access_review(body)
        except Exception:
            return False
        status = getattr(review, "status", None)
        return bool(status is not None and status.allowed)
