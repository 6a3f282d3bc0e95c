"""Kubeconfig resolution and staging.

A provider's ``kubeconfig`` kwarg is one of:

* absent / empty: the default loading order (in-cluster ServiceAccount, then ``KUBECONFIG``,
  then ``~/.kube/config``); nothing is staged;
* a **path** (a string starting with ``/``, ``./`` or ``~`` and holding no newline): read from
  disk where it is, never copied;
* **inline content** (any other string): written to a chmod-600 temp file for the duration of
  the call;
* ``{"$secret": NAME}``: resolved by a :class:`SecretResolver` to plaintext, written to a
  chmod-600 temp file for the duration of the call.

Staged files are removed in a ``finally``, also when the call fails. Plaintext is registered
with the log redactor while staged, and no error message ever includes it.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from nymph.errors import CredentialsError
from nymph.logs import forget_secret, register_secret

_SECRET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


class SecretResolver(Protocol):
    def resolve(self, name: str) -> str:
        """Return the plaintext of secret ``name`` or raise :class:`CredentialsError`."""


@dataclass(frozen=True)
class EnvSecretResolver:
    """``$secret: prod-kube`` -> env ``NYMPH_SECRET_PROD_KUBE``."""

    prefix: str = "NYMPH_SECRET_"
    environ: Mapping[str, str] | None = None

    def var(self, name: str) -> str:
        return self.prefix + re.sub(r"[^A-Za-z0-9]", "_", name).upper()

    def resolve(self, name: str) -> str:
        env = os.environ if self.environ is None else self.environ
        value = env.get(self.var(name))
        if value is None:
            raise CredentialsError(f"secret {name!r} not found: set {self.var(name)}")
        return value


@dataclass(frozen=True)
class FileSecretResolver:
    """``$secret: prod-kube`` -> the file ``<directory>/prod-kube`` (a mounted Secret volume)."""

    directory: Path

    def resolve(self, name: str) -> str:
        path = Path(self.directory) / name
        try:
            return path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise CredentialsError(f"secret {name!r} not found: no file {path}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise CredentialsError(
                f"secret {name!r}: cannot read {path} ({exc.__class__.__name__})"
            ) from None


@dataclass(frozen=True)
class ChainSecretResolver:
    """Try each resolver in turn; the first that knows the name wins."""

    resolvers: Sequence[SecretResolver]

    def resolve(self, name: str) -> str:
        misses: list[str] = []
        for r in self.resolvers:
            try:
                return r.resolve(name)
            except CredentialsError as exc:
                misses.append(str(exc))
        raise CredentialsError("; ".join(misses) or f"secret {name!r}: no resolver configured")


def default_resolver() -> SecretResolver:
    resolvers: list[SecretResolver] = [EnvSecretResolver()]
    directory = os.environ.get("NYMPH_SECRETS_DIR")
    if directory:
        resolvers.append(FileSecretResolver(Path(directory)))
    return ChainSecretResolver(resolvers)


def looks_like_path(value: str) -> bool:
    return "\n" not in value and value.startswith(("/", "./", "~"))


def describe(ref: object) -> str:
    """A loggable description of a kubeconfig ref (never the content)."""
    if ref in (None, ""):
        return "default"
    if isinstance(ref, Mapping) and "$secret" in ref:
        return f"secret:{ref['$secret']}"
    if isinstance(ref, str) and looks_like_path(ref):
        return f"path:{ref}"
    return "inline"


def _stage(content: str, directory: str | None) -> str:
    fd, path = tempfile.mkstemp(prefix="nymph-kubeconfig-", suffix=".yaml", dir=directory)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(content)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    return path


@contextlib.contextmanager
def staged_kubeconfig(
    ref: object, *, resolver: SecretResolver | None = None, tmpdir: str | None = None
) -> Iterator[str | None]:
    """Yield a kubeconfig path for ``ref`` (``None`` = default loading); clean up afterwards."""
    if ref is None or ref == "":
        yield None
        return
    if isinstance(ref, Mapping):
        if set(ref) != {"$secret"}:
            raise CredentialsError('kubeconfig: a secret reference is exactly {"$secret": NAME}')
        name = ref["$secret"]
        if not isinstance(name, str) or not _SECRET_NAME.match(name):
            raise CredentialsError("kubeconfig: $secret must name a secret (letters, digits, '.', '_', '-')")
        plaintext = (resolver or default_resolver()).resolve(name)
        register_secret(plaintext)
        path = _stage(plaintext, tmpdir)
        try:
            yield path
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            forget_secret(plaintext)
        return
    if not isinstance(ref, str):
        raise CredentialsError('kubeconfig: expected a path, inline content or {"$secret": NAME}')
    if looks_like_path(ref):
        path = os.path.expanduser(ref)
        if not os.path.isfile(path):
            raise CredentialsError(f"kubeconfig path {ref} does not exist or is not a file")
        yield path
        return
    register_secret(ref)
    path = _stage(ref, tmpdir)
    try:
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        forget_secret(ref)
