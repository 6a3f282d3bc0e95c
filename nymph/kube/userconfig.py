"""User-supplied kubeconfigs: accepted by allow-list only, and turned into a client here.

A kubeconfig a user hands the queue (inline content or a ``$secret``) is narrower than
kubectl's on purpose. kubectl runs ``exec`` plugins and ``auth-provider`` helpers, reads
``tokenFile`` and every ``certificate-authority`` / ``client-certificate`` / ``client-key``
path, and goes through any ``proxy-url``; in the queue each of these would run or read
something on the queue's own host (or send it where the user says). So only these keys are
accepted, anything else is refused naming the field (never quoting a value):

* structure: ``apiVersion``, ``kind``, ``preferences``, ``current-context``, ``clusters[].name``,
  ``contexts[].name``, ``contexts[].context.{cluster,user,namespace}``, ``users[].name``, and
  ``extensions`` lists where kubectl has them (kept as data, never read);
* ``clusters[].cluster``: ``server``, ``certificate-authority-data``, ``tls-server-name``, and
  ``insecure-skip-tls-verify`` only where the operator allows it (``--allow-insecure-tls``);
* ``users[].user``: ``client-certificate-data`` with ``client-key-data``, ``token``,
  ``username`` with ``password``.

:func:`build_client` makes the ``ApiClient`` from the checked fields itself (no kubeconfig
loader sees the document): the CA goes in as data, the client certificate and key through
0600 files in a private 0700 directory that is removed before the client is returned (Python's
ssl reads a key only from a file), and every connection goes through the
:class:`~nymph.kube.netguard.ConnectGuard` of the operator's :class:`ServerPolicy`.
"""

from __future__ import annotations

import base64
import binascii
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from nymph.errors import CredentialsError

INSECURE_FLAG = "--allow-insecure-tls"

_TOP = {"apiVersion", "kind", "preferences", "current-context", "clusters", "contexts", "users", "extensions"}
_CLUSTER = {
    "server",
    "certificate-authority-data",
    "tls-server-name",
    "insecure-skip-tls-verify",
    "extensions",
}
_CONTEXT = {"cluster", "user", "namespace", "extensions"}
_USER = {"client-certificate-data", "client-key-data", "token", "username", "password", "extensions"}
_PREFERENCES = {"colors", "extensions"}

#: Why a known key is refused (else: "not a field a user-supplied kubeconfig may carry").
_WHY: dict[str, str] = {
    "exec": "an exec plugin would run a command on the queue's host",
    "auth-provider": "an auth provider would make the queue fetch tokens from a URL the kubeconfig names",
    "tokenFile": "a token file would be read from the queue's host",
    "certificate-authority": "a file path would be read from the queue's host; use certificate-authority-data",
    "client-certificate": "a file path would be read from the queue's host; use client-certificate-data",
    "client-key": "a file path would be read from the queue's host; use client-key-data",
    "proxy-url": "the queue connects to the API server itself and goes through no proxy a kubeconfig names",
    "as": "impersonation is not available to a user-supplied kubeconfig",
    "as-uid": "impersonation is not available to a user-supplied kubeconfig",
    "as-groups": "impersonation is not available to a user-supplied kubeconfig",
    "as-user-extra": "impersonation is not available to a user-supplied kubeconfig",
}


@dataclass(frozen=True)
class UserCluster:
    server: str
    host: str
    ca_data: bytes | None = None
    tls_server_name: str | None = None
    insecure: bool = False


@dataclass(frozen=True)
class UserAuth:
    cert_data: bytes | None = None
    key_data: bytes | None = None
    token: str | None = None
    username: str | None = None
    password: str | None = None


@dataclass(frozen=True)
class UserKubeconfig:
    """The checked parts of a user-supplied kubeconfig, for the context it selects."""

    context: str
    cluster: UserCluster
    auth: UserAuth


def _refuse(path: str, key: str, what: str) -> CredentialsError:
    why = _WHY.get(
        key,
        "not a field a user-supplied kubeconfig may carry (only server, CA data, "
        "client certificate/key data, token or basic auth)",
    )
    return CredentialsError(
        f"kubeconfig {what}: {path}.{key}: {why}" if path else f"kubeconfig {what}: {key}: {why}"
    )


_KEY_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")


def _keys(obj: Mapping[Any, Any], allowed: set[str], *, path: str, what: str) -> None:
    for key in obj:
        if not isinstance(key, str) or key not in allowed:
            # a key is named only when it looks like one (a pasted value is never quoted)
            shown = key if isinstance(key, str) and _KEY_NAME.match(key) else "(an unknown key)"
            raise _refuse(path, shown, what)


def _mapping(obj: object, *, path: str, what: str) -> Mapping[str, Any]:
    if obj is None:
        return {}
    if not isinstance(obj, Mapping):
        raise CredentialsError(f"kubeconfig {what}: {path} must be a mapping")
    return obj


def _text(obj: Mapping[str, Any], key: str, *, path: str, what: str) -> str | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise CredentialsError(f"kubeconfig {what}: {path}.{key} must be a string")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise CredentialsError(f"kubeconfig {what}: {path}.{key} holds a control character")
    return value


def _b64(obj: Mapping[str, Any], key: str, *, path: str, what: str) -> bytes | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise CredentialsError(f"kubeconfig {what}: {path}.{key} must be base64 text")
    try:
        data = base64.b64decode("".join(value.split()), validate=True)
    except (binascii.Error, ValueError):
        raise CredentialsError(f"kubeconfig {what}: {path}.{key} is not valid base64") from None
    if not data:
        raise CredentialsError(f"kubeconfig {what}: {path}.{key} is empty")
    return data


def _extensions(obj: Mapping[str, Any], *, path: str, what: str) -> None:
    ext = obj.get("extensions")
    if ext is not None and not isinstance(ext, list):
        raise CredentialsError(f"kubeconfig {what}: {path}.extensions must be a list")


def _server(value: str | None, *, path: str, what: str) -> tuple[str, str]:
    if not value:
        raise CredentialsError(f"kubeconfig {what}: {path}.server is missing")
    try:
        url = urllib.parse.urlsplit(value)
        _ = url.port  # a port that is not a number raises
    except ValueError:
        raise CredentialsError(f"kubeconfig {what}: {path}.server is not a URL") from None
    if url.scheme not in ("https", "http") or not url.hostname:
        raise CredentialsError(f"kubeconfig {what}: {path}.server must be an https:// (or http://) URL")
    if url.username is not None or url.password is not None:
        raise CredentialsError(f"kubeconfig {what}: {path}.server must not carry credentials")
    if url.query or url.fragment:
        raise CredentialsError(f"kubeconfig {what}: {path}.server must not carry a query or fragment")
    return value.rstrip("/"), url.hostname


def _named(
    doc: Mapping[str, Any], section: str, inner: str, allowed: set[str], *, what: str
) -> dict[str, tuple[str, Mapping[str, Any]]]:
    """``name -> (path, body)`` of a section's entries (the first of a name wins, as kubectl's)."""
    items = doc.get(section) or []
    if not isinstance(items, list):
        raise CredentialsError(f"kubeconfig {what}: {section} must be a list")
    out: dict[str, tuple[str, Mapping[str, Any]]] = {}
    for i, item in enumerate(items):
        path = f"{section}[{i}]"
        entry = _mapping(item, path=path, what=what)
        _keys(entry, {"name", inner}, path=path, what=what)
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise CredentialsError(f"kubeconfig {what}: {path}.name must be a non-empty string")
        body = _mapping(entry.get(inner), path=f"{path}.{inner}", what=what)
        _keys(body, allowed, path=f"{path}.{inner}", what=what)
        _extensions(body, path=f"{path}.{inner}", what=what)
        out.setdefault(name, (f"{path}.{inner}", body))
    return out


@dataclass(frozen=True)
class _Checked:
    clusters: dict[str, UserCluster]
    users: dict[str, UserAuth]
    contexts: dict[str, Mapping[str, Any]]
    current: str | None


def check_user_fields(text: str, *, what: str, allow_insecure: bool = False) -> tuple[str, ...]:
    """Refuse (:class:`CredentialsError`, naming the field, never quoting the text) a
    user-supplied kubeconfig that carries anything outside the allow-list; else the hosts of
    its servers."""
    checked = _check(text, what=what, allow_insecure=allow_insecure)
    return tuple(c.host for c in checked.clusters.values())


def check_user_kubeconfig(
    text: str, *, what: str, context: str | None = None, allow_insecure: bool = False
) -> UserKubeconfig:
    """Check a user-supplied kubeconfig against the allow-list and select its context (a
    named ``context`` must exist; else ``current-context``). :class:`CredentialsError` names
    the refused field and never quotes the text."""
    checked = _check(text, what=what, allow_insecure=allow_insecure)
    contexts = checked.contexts
    if context:
        if context not in contexts:
            names = ", ".join(contexts) or "none"
            raise CredentialsError(f"context {context!r} is not in kubeconfig {what} (it has: {names})")
        chosen = context
    elif checked.current:
        if checked.current not in contexts:
            raise CredentialsError(f"kubeconfig {what}: current-context names no context of the file")
        chosen = checked.current
    else:
        raise CredentialsError(f"kubeconfig {what}: names no current-context; give the provider a 'context'")
    ctx = contexts[chosen]
    cluster = checked.clusters.get(str(ctx.get("cluster") or ""))
    if cluster is None:
        raise CredentialsError(f"kubeconfig {what}: context {chosen!r} names no cluster of the file")
    user_name = ctx.get("user")
    found = checked.users.get(str(user_name)) if user_name else UserAuth()
    if found is None:
        raise CredentialsError(f"kubeconfig {what}: context {chosen!r} names no user of the file")
    return UserKubeconfig(context=chosen, cluster=cluster, auth=found)


def _check(text: str, *, what: str, allow_insecure: bool) -> _Checked:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        doc = None
    if not isinstance(doc, Mapping) or not any(k in doc for k in ("clusters", "contexts", "users")):
        raise CredentialsError(
            f"kubeconfig {what} does not parse as a kubeconfig (YAML with clusters, contexts and users lists)"
        )
    _keys(doc, _TOP, path="", what=what)
    _extensions(doc, path="(top level)", what=what)
    prefs = _mapping(doc.get("preferences"), path="preferences", what=what)
    _keys(prefs, _PREFERENCES, path="preferences", what=what)
    clusters = _named(doc, "clusters", "cluster", _CLUSTER, what=what)
    contexts = _named(doc, "contexts", "context", _CONTEXT, what=what)
    users = _named(doc, "users", "user", _USER, what=what)
    checked: dict[str, UserCluster] = {}
    for name, (path, c) in clusters.items():
        insecure = c.get("insecure-skip-tls-verify", False)
        if not isinstance(insecure, bool):
            raise CredentialsError(
                f"kubeconfig {what}: {path}.insecure-skip-tls-verify must be true or false"
            )
        if insecure and not allow_insecure:
            raise CredentialsError(
                f"kubeconfig {what}: {path}.insecure-skip-tls-verify: this queue does not connect "
                "without verifying the server's certificate; give certificate-authority-data, or "
                f"have the operator start the queue with '{INSECURE_FLAG}'"
            )
        server, host = _server(_text(c, "server", path=path, what=what), path=path, what=what)
        checked[name] = UserCluster(
            server=server,
            host=host,
            ca_data=_b64(c, "certificate-authority-data", path=path, what=what),
            tls_server_name=_text(c, "tls-server-name", path=path, what=what),
            insecure=insecure,
        )
    auths: dict[str, UserAuth] = {}
    for name, (path, u) in users.items():
        auth = UserAuth(
            cert_data=_b64(u, "client-certificate-data", path=path, what=what),
            key_data=_b64(u, "client-key-data", path=path, what=what),
            token=_text(u, "token", path=path, what=what),
            username=_text(u, "username", path=path, what=what),
            password=_text(u, "password", path=path, what=what),
        )
        if (auth.cert_data is None) != (auth.key_data is None):
            raise CredentialsError(
                f"kubeconfig {what}: {path}: client-certificate-data and client-key-data go together"
            )
        if (auth.username is None) != (auth.password is None):
            raise CredentialsError(f"kubeconfig {what}: {path}: username and password go together")
        auths[name] = auth
    for path, ctx in contexts.values():
        for key in ("cluster", "user", "namespace"):
            _text(ctx, key, path=path, what=what)
    current = doc.get("current-context")
    if current is not None and not isinstance(current, str):
        raise CredentialsError(f"kubeconfig {what}: current-context must be a string")
    return _Checked(
        clusters=checked,
        users=auths,
        contexts={name: body for name, (_, body) in contexts.items()},
        current=current or None,
    )


__all__ = [
    "INSECURE_FLAG",
    "UserAuth",
    "UserCluster",
    "UserKubeconfig",
    "check_user_fields",
    "check_user_kubeconfig",
]
