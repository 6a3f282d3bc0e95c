"""The queue's secret store: values encrypted at rest, per control-plane namespace.

Values are sealed with AES-256-GCM (the ``cryptography`` package); the namespace and name are
the associated data, so a ciphertext copied to another namespace or name does not open. The key
is a file outside the database: ``queue serve --secret-key-file FILE`` (e.g. a mounted Kubernetes
Secret; it must exist), or, for a single local queue, a file beside the database created 0600 on
first use. A missing or wrong key while the database holds secrets is a clear error, never a
silent reset. No route ever returns a value; the only reader is the direct dispatch, which
resolves ``{"$secret": NAME}`` refs from this store (and nowhere else).
"""

from __future__ import annotations

import base64
import os
import secrets as pysecrets
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from nymph.errors import ConfigError, CredentialsError

_NONCE = 12
_VERSION = b"n1"


class SecretKeyError(ConfigError):
    """The secret key file is missing, unreadable or does not open the stored secrets."""


def default_key_file(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + ".secret-key")


@dataclass(frozen=True)
class KeySource:
    """Where the key is: ``path``; ``create`` when it may be made on first use (local queue).
    No ``path``: there is none (PostgreSQL without ``--secret-key-file``: replicas share no disk,
    so the queue never makes a key of its own there)."""

    path: Path | None
    create: bool


NO_SHARED_KEY = (
    "the queue on PostgreSQL makes no secret key of its own (its replicas share no disk): give "
    "every replica the same key with --secret-key-file FILE (e.g. a mounted Kubernetes Secret)"
)


def _read_key(path: Path) -> bytes:
    try:
        raw = path.read_text(encoding="ascii").strip()
        key = base64.urlsafe_b64decode(raw)
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as exc:
        raise SecretKeyError(
            f"secret key file {path}: cannot read a key from it ({exc.__class__.__name__})"
        ) from None
    if len(key) != 32:
        raise SecretKeyError(f"secret key file {path}: not a nymph secret key (expected 32 bytes, base64)")
    return key


def _create_key(path: Path) -> bytes:
    key = AESGCM.generate_key(bit_length=256)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as fh:
        fh.write(base64.urlsafe_b64encode(key).decode("ascii") + "\n")
    return key


class SecretBox:
    """Seal and open secret values with the key from a :class:`KeySource` (loaded lazily)."""

    def __init__(self, *, source: KeySource) -> None:
        self.source = source
        self._key: bytes | None = None

    def _load(self, *, have_secrets: bool, for_write: bool) -> bytes:
        if self._key is not None:
            return self._key
        path = self.source.path
        if path is None:
            raise SecretKeyError(NO_SHARED_KEY)
        try:
            self._key = _read_key(path)
        except FileNotFoundError:
            if have_secrets:
                raise SecretKeyError(
                    f"secret key file {path} is missing, but the database holds encrypted "
                    "secrets: restore that file (the secrets cannot be read without it; the queue "
                    "never makes a new key over existing secrets)"
                ) from None
            if not (self.source.create and for_write):
                raise SecretKeyError(
                    f"secret key file {path} does not exist: create it (32 random bytes, base64) "
                    "or mount the Secret that holds it"
                ) from None
            self._key = _create_key(path)
        return self._key

    def check(self, *, sample: tuple[str, str, bytes] | None) -> None:
        """At start: when the database holds secrets, the key must be there and open them."""
        if sample is None:
            return
        ns, name, blob = sample
        self.open(ns=ns, name=name, blob=blob, have_secrets=True)

    def seal(self, *, ns: str, name: str, value: str, have_secrets: bool) -> bytes:
        key = self._load(have_secrets=have_secrets, for_write=True)
        nonce = pysecrets.token_bytes(_NONCE)
        return _VERSION + nonce + AESGCM(key).encrypt(nonce, value.encode("utf-8"), _aad(ns, name))

    def open(self, *, ns: str, name: str, blob: bytes, have_secrets: bool = True) -> str:
        key = self._load(have_secrets=have_secrets, for_write=False)
        if not blob.startswith(_VERSION):
            raise CredentialsError(f"secret {name!r} is stored in an unknown format")
        nonce, body = blob[len(_VERSION) : len(_VERSION) + _NONCE], blob[len(_VERSION) + _NONCE :]
        try:
            return AESGCM(key).decrypt(nonce, body, _aad(ns, name)).decode("utf-8")
        except InvalidTag:
            raise SecretKeyError(
                f"secret {name!r} in namespace {ns!r} does not open with the key in "
                f"{self.source.path}: is that the key this database was written with?"
            ) from None


def _aad(ns: str, name: str) -> bytes:
    return f"nymph-secret\x00{ns}\x00{name}".encode()


@dataclass(frozen=True)
class FetchedSecrets:
    """A :class:`~nymph.kube.credentials.SecretResolver` over values already read from the
    store for one call (the store is async; staging is not)."""

    values: dict[str, str]
    namespace: str

    def resolve(self, name: str) -> str:
        try:
            return self.values[name]
        except KeyError:
            raise CredentialsError(
                f"no secret {name!r} in namespace {self.namespace!r}: create it with "
                f"'nymph secrets set {name} --from-file FILE'"
            ) from None
