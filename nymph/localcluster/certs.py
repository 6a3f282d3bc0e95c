"""Certificates for the local control plane, generated with ``cryptography``."""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class NodePKI:
    """A real node's credentials: its identity towards the API server (``system:node:<name>``
    in ``system:nodes``, for the Node authorizer and NodeRestriction), its kubelet's serving
    certificate for the node IP, and the API server's client certificate towards kubelets."""

    node_client: KeyPair
    kubelet_serving: KeyPair
    apiserver_kubelet_client: KeyPair


@dataclass(frozen=True)
class PKI:
    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path
    node: NodePKI | None = None


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def make_pki(directory: Path, *, extra_ips: tuple[str, ...] = (), node: str | None = None) -> PKI:
    """CA, API server serving cert (SANs: localhost, the ``kubernetes`` Service names, 127.0.0.1,
    10.0.0.1 and ``extra_ips``), admin client cert, service-account keys; with ``node`` also the
    real node's credentials (:class:`NodePKI`, the kubelet serving cert valid for ``extra_ips``)."""
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    later = now + dt.timedelta(days=7)

    ca_key = _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nymph-local-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(later)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(
        cn: str, orgs: list[str], *, server: bool, sans: list[x509.GeneralName] | None = None
    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = _key()
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
        attrs += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(later)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return builder.sign(ca_key, hashes.SHA256()), key

    ips: list[x509.GeneralName] = [
        x509.IPAddress(ipaddress.ip_address(ip)) for ip in ("127.0.0.1", "10.0.0.1", *extra_ips)
    ]
    api_sans: list[x509.GeneralName] = [
        x509.DNSName(n) for n in ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc")
    ]
    serving, serving_key = leaf("kube-apiserver", [], server=True, sans=api_sans + ips)
    admin, admin_key = leaf("nymph-admin", ["system:masters"], server=False)
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    pki = PKI(
        ca_cert=directory / "ca.crt",
        ca_key=directory / "ca.key",
        serving_cert=directory / "apiserver.crt",
        serving_key=directory / "apiserver.key",
        admin_cert=directory / "admin.crt",
        admin_key=directory / "admin.key",
        sa_key=directory / "sa.key",
        sa_pub=directory / "sa.pub",
        node=None if node is None else _node_pki(directory, node, extra_ips, leaf),
    )
    _write_cert(pki.ca_cert, ca)
    _write_key(pki.ca_key, ca_key)
    _write_cert(pki.serving_cert, serving)
    _write_key(pki.serving_key, serving_key)
    _write_cert(pki.admin_cert, admin)
    _write_key(pki.admin_key, admin_key)
    _write_key(pki.sa_key, sa_key)
    pki.sa_pub.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pki


_Leaf = Callable[..., tuple[x509.Certificate, ec.EllipticCurvePrivateKey]]


def _node_pki(directory: Path, node: str, ips: tuple[str, ...], leaf: _Leaf) -> NodePKI:
    def pair(name: str, made: tuple[x509.Certificate, ec.EllipticCurvePrivateKey]) -> KeyPair:
        kp = KeyPair(cert=directory / f"{name}.crt", key=directory / f"{name}.key")
        _write_cert(kp.cert, made[0])
        _write_key(kp.key, made[1])
        return kp

    sans: list[x509.GeneralName] = [x509.DNSName(node)]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    return NodePKI(
        node_client=pair("node-client", leaf(f"system:node:{node}", ["system:nodes"], server=False)),
        kubelet_serving=pair("kubelet-serving", leaf(f"system:node:{node}", [], server=True, sans=sans)),
        apiserver_kubelet_client=pair(
            "apiserver-kubelet-client",
            leaf("kube-apiserver-kubelet-client", ["system:masters"], server=False),
        ),
    )
