"""Kubeconfig resolution and staging.

A provider's ``kubeconfig`` kwarg is one of:

* absent / empty: the default loading order (in-cluster ServiceAccount, then ``KUBECONFIG``,
  then ``~/.kube/config``), only where the :class:`CredentialPolicy` allows these *ambient*
  credentials; nothing is staged;
* a **path** (a string starting with ``/``, ``./`` or ``~`` and holding no newline): read from
  disk where it is, never copied, and only inside the policy's directories (after resolving
  symlinks);
* **inline content** (any other string): written to a chmod-600 temp file for the duration of
  the call;
* ``{"$secret": NAME}``: resolved by a :class:`SecretResolver` to plaintext, written to a
  chmod-600 temp file for the duration of the call.

Staged files are removed in a ``finally``, also when the call fails. Plaintext is registered
with the log redactor while staged, and no error message ever includes it: a kubeconfig that
does not parse is reported without quoting any of its bytes.
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

import yaml

from nymph.errors import CredentialsError
from nymph.logs import forget_secret, register_secret

SECRET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")
_SECRET_NAME = SECRET_NAME


@dataclass(frozen=True)
class CredentialPolicy:
    """What a kubeconfig ref may reach on this host.

    ``kubeconfig_dirs``: the directories path kubeconfigs must resolve into (``None``: any path,
    for a single user's own tools; ``()``: none, path kubeconfigs are refused). ``ambient``: a
    ref that names no kubeconfig may use this host's own credentials (``KUBECONFIG``,
    ``~/.kube/config`` or the in-cluster ServiceAccount).
    """

    kubeconfig_dirs: tuple[Path, ...] | None = None
    ambient: bool = True


#: A single user's own tools: any path, ambient credentials allowed.
OPEN_POLICY = CredentialPolicy()


def allowed_path(ref: str, *, policy: CredentialPolicy) -> str:
    """The real path of a path kubeconfig, if the policy lets it be read; else a clear error."""
    path = os.path.realpath(os.path.expanduser(ref))
    dirs = policy.kubeconfig_dirs
    if dirs is not None:
        if not dirs:
            raise CredentialsError(
                f"kubeconfig path {ref}: this queue reads no kubeconfig files (none of its "
                "directories is allowed); the operator can allow one with "
                "'nymph queue serve --kubeconfig-dir DIR', or store the kubeconfig as a secret "
                "('nymph secrets set NAME --from-file FILE') and use {\"$secret\": NAME}"
            )
        roots = [os.path.realpath(d) for d in dirs]
        if not any(os.path.commonpath([root, path]) == root for root in roots):
            raise CredentialsError(
                f"kubeconfig path {ref} is outside the directories this queue may read "
                f"({', '.join(str(d) for d in dirs)}, symlinks resolved): move it there, ask the "
                "operator to add '--kubeconfig-dir DIR', or store it as a secret"
            )
    if not os.path.isfile(path):
        raise CredentialsError(f"kubeconfig path {ref} does not exist or is not a file")
    return path


def check_kubeconfig_text(text: str, *, what: str, context: str | None = None) -> None:
    """Raise :class:`CredentialsError` unless ``text`` parses as a kubeconfig (and has
    ``context`` when one is named). The message never quotes the text."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        doc = None
    sections = ("clusters", "contexts", "users")
    if (
        not isinstance(doc, dict)
        or not any(k in doc for k in sections)
        or not all(isinstance(doc.get(k) or [], list) for k in sections)
    ):
        raise CredentialsError(
            f"kubeconfig {what} does not parse as a kubeconfig (YAML with clusters, contexts and users lists)"
        )
    if context:
        known = [c.get("name") for c in doc.get("contexts") or [] if isinstance(c, dict)]
        if context not in known:
            names = ", ".join(str(n) for n in known if isinstance(n, str)) or "none"
            raise CredentialsError(f"context {context!r} is not in kubeconfig {what} (it has: {names})")


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
    ref: object,
    *,
    resolver: SecretResolver | None = None,
    tmpdir: str | None = None,
    policy: CredentialPolicy = OPEN_POLICY,
    context: str | None = None,
) -> Iterator[str | None]:
    """Yield a kubeconfig path for ``ref`` (``None`` = default loading); clean up afterwards.

    Inline content and resolved secrets are checked to be a kubeconfig (with ``context``, if
    named), written 0600 under ``tmpdir`` and removed in a ``finally``.
    """
    if ref is None or ref == "":
        if not policy.ambient:
            raise CredentialsError(
                "this provider names no kubeconfig, and this queue does not lend its own "
                'credentials: give the provider a kubeconfig ({"$secret": NAME} or a path), '
                "or have the operator start the queue with '--ambient-kubeconfig'"
            )
        yield None
        return
    if isinstance(ref, Mapping):
        if set(ref) != {"$secret"}:
            raise CredentialsError('kubeconfig: a secret reference is exactly {"$secret": NAME}')
        name = ref["$secret"]
        if not isinstance(name, str) or not SECRET_NAME.match(name):
            raise CredentialsError("kubeconfig: $secret must name a secret (letters, digits, '.', '_', '-')")
        plaintext = (resolver or default_resolver()).resolve(name)
        with _staged_text(plaintext, what=f"(secret {name})", context=context, tmpdir=tmpdir) as path:
            yield path
        return
    if not isinstance(ref, str):
        raise CredentialsError('kubeconfig: expected a path, inline content or {"$secret": NAME}')
    if looks_like_path(ref):
        path = allowed_path(ref, policy=policy)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CredentialsError(
                f"kubeconfig path {ref}: cannot read it ({exc.__class__.__name__})"
            ) from None
        check_kubeconfig_text(text, what=f"(path {ref})", context=context)
        yield path
        return
    with _staged_text(ref, what="(inline)", context=context, tmpdir=tmpdir) as path:
        yield path


@contextlib.contextmanager
def _staged_text(plaintext: str, *, what: str, context: str | None, tmpdir: str | None) -> Iterator[str]:
    register_secret(plaintext)
    try:
        check_kubeconfig_text(plaintext, what=what, context=context)
        path = _stage(plaintext, tmpdir)
        try:
            yield path
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    finally:
        forget_secret(plaintext)
