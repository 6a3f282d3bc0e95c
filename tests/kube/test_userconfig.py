"""User-supplied kubeconfigs: only the allow-listed fields pass, every other one is refused by
name without quoting any value, and the client built from them carries exactly those fields."""

from __future__ import annotations

import base64
import copy
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from nymph.errors import CredentialsError
from nymph.kube.netguard import ServerPolicy
from nymph.kube.userclient import build_client, configuration
from nymph.kube.userconfig import check_user_fields, check_user_kubeconfig

SECRET = "PLANTED-VALUE-d41d8cd98f"


def base() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://kube.example.test:6443"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u", "namespace": "jobs"}}],
        "users": [{"name": "u", "user": {"token": SECRET}}],
    }


def text(doc: dict[str, Any]) -> str:
    return yaml.safe_dump(doc)


def refused(doc: dict[str, Any], **kw: Any) -> str:
    with pytest.raises(CredentialsError) as info:
        check_user_kubeconfig(text(doc), what="(inline)", **kw)
    message = str(info.value)
    assert SECRET not in message and "/etc/" not in message and "evil" not in message
    return message


FORBIDDEN: list[tuple[str, str, str, Any]] = [
    ("users", "user", "exec", {"command": "/bin/sh", "args": ["-c", "id > /tmp/evil"], "apiVersion": "v1"}),
    (
        "users",
        "user",
        "auth-provider",
        {
            "name": "oidc",
            "config": {"idp-issuer-url": "http://169.254.169.254/evil", "client-secret": SECRET},
        },
    ),
    ("users", "user", "tokenFile", "/etc/evil-token"),
    ("users", "user", "client-certificate", "/etc/evil.crt"),
    ("users", "user", "client-key", "/etc/evil.key"),
    ("users", "user", "as", "system:admin"),
    ("users", "user", "as-groups", ["system:masters"]),
    ("users", "user", "some-future-field", SECRET),
    ("clusters", "cluster", "certificate-authority", "/etc/evil-ca.crt"),
    ("clusters", "cluster", "proxy-url", "http://evil.example.test:3128"),
    ("clusters", "cluster", "disable-compression", True),
    ("contexts", "context", "as", "evil"),
]


@pytest.mark.parametrize(("section", "inner", "key", "value"), FORBIDDEN, ids=[f[2] for f in FORBIDDEN])
def test_each_forbidden_field_is_refused_by_its_path(section: str, inner: str, key: str, value: Any) -> None:
    doc = base()
    doc[section][0][inner][key] = value
    message = refused(doc)
    assert f"{section}[0].{inner}.{key}:" in message


def test_an_unknown_key_that_looks_like_a_value_is_not_quoted() -> None:
    doc = base()
    doc["users"][0]["user"][f"{SECRET}/x y"] = 1
    assert "users[0].user.(an unknown key)" in refused(doc)


def test_a_forbidden_field_in_an_unused_entry_is_refused_too() -> None:
    doc = base()
    doc["users"].append({"name": "other", "user": {"exec": {"command": "/bin/true"}}})
    assert "users[1].user.exec" in refused(doc)


@pytest.mark.parametrize(
    ("where", "key"),
    [((), "x-unknown"), (("preferences",), "x-unknown"), (("clusters", 0), "x"), (("users", 0), "x")],
)
def test_unknown_keys_anywhere_are_refused(where: tuple[Any, ...], key: str) -> None:
    doc = base()
    target: Any = doc
    for step in where:
        target = target[step]
    target[key] = "evil"
    assert key in refused(doc)


def test_every_allowed_field_is_accepted_and_used() -> None:
    ca = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    doc = base()
    doc["extensions"] = [{"name": "x", "extension": {}}]
    doc["preferences"] = {"colors": True, "extensions": []}
    doc["clusters"][0]["cluster"].update(
        {
            "certificate-authority-data": base64.b64encode(ca).decode(),
            "tls-server-name": "kube.internal",
            "extensions": [{"name": "cluster_info", "extension": {"provider": "minikube"}}],
        }
    )
    doc["contexts"][0]["context"]["extensions"] = []
    doc["users"][0]["user"].update(
        {
            "client-certificate-data": base64.b64encode(b"cert").decode(),
            "client-key-data": base64.b64encode(b"key").decode(),
            "extensions": [],
        }
    )
    doc["users"].append({"name": "basic", "user": {"username": "alice", "password": SECRET}})
    assert check_user_fields(text(doc), what="(inline)") == ("kube.example.test",)
    kc = check_user_kubeconfig(text(doc), what="(inline)")
    assert kc.context == "c"
    assert kc.cluster.server == "https://kube.example.test:6443"
    assert kc.cluster.ca_data == ca and kc.cluster.tls_server_name == "kube.internal"
    assert kc.auth.cert_data == b"cert" and kc.auth.key_data == b"key" and kc.auth.token == SECRET
    cfg = configuration(kc)
    assert cfg.host == "https://kube.example.test:6443" and cfg.verify_ssl
    assert cfg.api_key["BearerToken"] == f"Bearer {SECRET}"
    assert cfg.ssl_ca_cert is None and cfg.cert_file is None and cfg.key_file is None


def test_basic_auth_becomes_an_authorization_header() -> None:
    doc = base()
    doc["users"][0]["user"] = {"username": "alice", "password": SECRET}
    cfg = configuration(check_user_kubeconfig(text(doc), what="(inline)"))
    expected = base64.b64encode(f"alice:{SECRET}".encode()).decode()
    assert cfg.api_key["BearerToken"] == f"Basic {expected}"


def test_insecure_skip_tls_verify_only_where_the_operator_allows_it() -> None:
    doc = base()
    doc["clusters"][0]["cluster"]["insecure-skip-tls-verify"] = True
    assert "--allow-insecure-tls" in refused(doc)
    kc = check_user_kubeconfig(text(doc), what="(inline)", allow_insecure=True)
    assert kc.cluster.insecure and configuration(kc).verify_ssl is False
    doc["clusters"][0]["cluster"]["insecure-skip-tls-verify"] = False
    assert not check_user_kubeconfig(text(doc), what="(inline)").cluster.insecure


@pytest.mark.parametrize(
    "server",
    ["", "ftp://kube.example.test", "https://user:pw@kube.example.test", "https://k?x=1", "not a url", 7],
)
def test_a_server_must_be_a_plain_http_or_https_url(server: Any) -> None:
    doc = base()
    doc["clusters"][0]["cluster"]["server"] = server
    assert "clusters[0].cluster" in refused(doc)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("client-key-data", "not base64 !!"),
        ("token", "abc\r\nX-Injected: 1"),
        ("password", SECRET),  # without a username
        ("client-key-data", base64.b64encode(b"k").decode()),  # without a certificate
    ],
)
def test_malformed_credentials_are_refused_without_quoting_them(key: str, value: str) -> None:
    doc = base()
    doc["users"][0]["user"] = {key: value}
    message = refused(doc)
    assert "users[0].user" in message and value not in message


def test_context_selection_follows_kubectl() -> None:
    doc = base()
    doc["clusters"].append({"name": "k2", "cluster": {"server": "https://other.example.test"}})
    doc["contexts"].append({"name": "c2", "context": {"cluster": "k2", "user": "u"}})
    assert check_user_kubeconfig(text(doc), what="(i)").cluster.host == "kube.example.test"
    assert check_user_kubeconfig(text(doc), what="(i)", context="c2").cluster.host == "other.example.test"
    assert "is not in kubeconfig" in refused(doc, context="nope")
    no_current = copy.deepcopy(doc)
    del no_current["current-context"]
    assert "current-context" in refused(no_current)
    dangling = copy.deepcopy(doc)
    dangling["contexts"][0]["context"]["user"] = "ghost"
    assert "names no user" in refused(dangling)


@pytest.mark.parametrize("body", ["{", "- a\n- b\n", "just text", ""])
def test_not_a_kubeconfig_is_refused_without_quoting_it(body: str) -> None:
    with pytest.raises(CredentialsError, match="does not parse as a kubeconfig"):
        check_user_kubeconfig(body, what="(inline)")


async def test_the_client_holds_no_file_and_leaves_none_behind(tmp_path: Path) -> None:
    """Client certificate and key reach ssl through files that are gone once the client is
    returned; the CA goes in as data."""
    from tests.support.certs import self_signed

    cert, key = self_signed("client")
    ca, _ = self_signed("ca")
    doc = base()
    doc["clusters"][0]["cluster"]["certificate-authority-data"] = base64.b64encode(ca).decode()
    doc["users"][0]["user"] = {
        "client-certificate-data": base64.b64encode(cert).decode(),
        "client-key-data": base64.b64encode(key).decode(),
    }
    kc = check_user_kubeconfig(text(doc), what="(inline)")
    stage = tmp_path / "stage"
    stage.mkdir()
    api = await build_client(kc, servers=ServerPolicy(), tmp_root=str(stage))
    try:
        assert os.listdir(stage) == []
        assert api.configuration.cert_file is None and api.configuration.key_file is None
    finally:
        await api.close()
    doc["users"][0]["user"]["client-key-data"] = base64.b64encode(b"not a key").decode()
    with pytest.raises(CredentialsError, match="not a certificate and its key"):
        await build_client(
            check_user_kubeconfig(text(doc), what="(i)"), servers=ServerPolicy(), tmp_root=str(stage)
        )
    assert os.listdir(stage) == []
