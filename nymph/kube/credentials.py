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

Two levels of trust: a path kubeconfig was placed by the operator in a directory they allowed
(a bare directory serves unscoped tokens, ``NS=DIR`` serves control-plane namespace NS) and
keeps kubectl's full semantics; inline and ``$secret`` content is user-supplied and accepted by
allow-list only (:mod:`nymph.kube.userconfig`), connecting only where the policy's
:class:`~nymph.kube.netguard.ServerPolicy` lets it.
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
from nymph.kube.netguard import DEFAULT_SERVERS, ServerPolicy
from nymph.kube.userconfig import check_user_fields
from nymph.logsetup import forget_secret, register_secret

SECRET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")
_SECRET_NAME = SECRET_NAME


DIR_FLAG = "--kubeconfig-dir"


@dataclass(frozen=True)
class CredentialPolicy:
    """What a kubeconfig ref may reach on this host.

    ``kubeconfig_dirs``: the *bare* directories path kubeconfigs may resolve into, for unscoped
    tokens (``None``: any path, for a single user's own tools; ``()``: none). ``team_dirs``:
    ``(NS, DIR)`` pairs, DIR serving control-plane namespace NS only. ``ambient``: a ref that
    names no kubeconfig may use this host's own credentials (``KUBECONFIG``, ``~/.kube/config``
    or the in-cluster ServiceAccount). ``servers``: where a user-supplied (inline or
    ``$secret``) kubeconfig may connect; ``allow_insecure_tls``: whether it may say
    ``insecure-skip-tls-verify``.
    """

    kubeconfig_dirs: tuple[Path, ...] | None = None
    ambient: bool = True
    team_dirs: tuple[tuple[str, Path], ...] = ()
    servers: ServerPolicy = DEFAULT_SERVERS
    allow_insecure_tls: bool = False

    def dirs_for(self, namespace: str | None, *, bare: bool) -> tuple[Path, ...] | None:
        """The directories a path kubeconfig of control-plane ``namespace`` may be read from
        (``bare``: the caller may use the bare ones too); None: any path."""
        if self.kubeconfig_dirs is None and not self.team_dirs:
            return None
        out = [d for ns, d in self.team_dirs if namespace is not None and ns == namespace]
        if bare:
            out += list(self.kubeconfig_dirs or ())
        return tuple(out)


#: A single user's own tools: any path, ambient credentials allowed.
OPEN_POLICY = CredentialPolicy()


def allowed_path(
    ref: str, *, policy: CredentialPolicy, namespace: str | None = None, bare: bool = True
) -> str:
    """The real path of a path kubeconfig, if the policy lets control-plane ``namespace`` read
    it (``bare``: the directories given without a namespace count too, for unscoped tokens and
    for loading); else a clear error naming the flag that would allow it."""
    if "\0" in ref:
        raise CredentialsError("kubeconfig path: holds a NUL byte")
    path = os.path.realpath(os.path.expanduser(ref))
    dirs = policy.dirs_for(namespace, bare=bare)
    if dirs is not None:
        flag = (
            f"'nymph queue serve {DIR_FLAG} {namespace}=DIR'"
            if namespace
            else f"'nymph queue serve {DIR_FLAG} DIR'"
        )
        who = f"namespace {namespace}" if namespace else "this caller"
        if not dirs:
            scoped = (
                f" (a bare '{DIR_FLAG} DIR' serves only tokens not scoped to a namespace)"
                if not bare and policy.kubeconfig_dirs
                else ""
            )
            raise CredentialsError(
                f"kubeconfig path {ref}: this queue reads no kubeconfig files for "
                f"{who}{scoped}; the operator can allow a directory with {flag}, "
                "or store the kubeconfig as a secret ('nymph secrets set NAME --from-file FILE') "
                'and use {"$secret": NAME}'
            )
        roots = [os.path.realpath(d) for d in dirs]
        if not any(os.path.commonpath([root, path]) == root for root in roots):
            raise CredentialsError(
                f"kubeconfig path {ref} is outside the directories this queue may read for "
                f"{who} ({', '.join(str(d) for d in dirs)}, symlinks resolved): move it there, "
                f"ask the operator to map one with {flag}, or store it as a secret"
            )
    if not os.path.isfile(path):
        raise CredentialsError(f"kubeconfig path {ref} does not exist or is not a file")
    return path


def check_kubeconfig_text(text: str, *, what: str, context: str | None = None) -> None:
    """Raise :class:`CredentialsError` unless ``text`` parses as a kubeconfig (and has
    ``context`` when one is named): the shape of an operator's path kubeconfig, whose
    content is trusted. The message never quotes the text."""
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
    namespace: str | None = None,
) -> Iterator[str | None]:
    """Yield a kubeconfig path for ``ref`` (``None`` = default loading); clean up afterwards.

    Inline content and resolved secrets are checked to be a kubeconfig (with ``context``, if
    named) of only the fields a user-supplied one may carry, written 0600 under ``tmpdir`` and
    removed in a ``finally``.
    """
    if ref is None or ref == "":
        if not policy.ambient:
            raise CredentialsError(
                "this provider names no kubeconfig, and this queue does not lend its own "
                "credentials: add one to the provider ('--kwarg kubeconfig=PATH' or "
                "'--kwarg kubeconfig={\"$secret\": NAME}' after nymph secrets set NAME --from-file FILE), "
                "use '--dispatch daemon' to have the nymph daemon in the cluster create its Pods, "
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
        with _staged_text(
            plaintext, what=f"(secret {name})", context=context, tmpdir=tmpdir, policy=policy
        ) as path:
            yield path
        return
    if not isinstance(ref, str):
        raise CredentialsError('kubeconfig: expected a path, inline content or {"$secret": NAME}')
    if looks_like_path(ref):
        path = allowed_path(ref, policy=policy, namespace=namespace)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CredentialsError(
                f"kubeconfig path {ref}: cannot read it ({exc.__class__.__name__})"
            ) from None
        check_kubeconfig_text(text, what=f"(path {ref})", context=context)
        yield path
        return
    with _staged_text(ref, what="(inline)", context=context, tmpdir=tmpdir, policy=policy) as path:
        yield path


@contextlib.contextmanager
def _staged_text(
    plaintext: str, *, what: str, context: str | None, tmpdir: str | None, policy: CredentialPolicy
) -> Iterator[str]:
    register_secret(plaintext)
    try:
        check_kubeconfig_text(plaintext, what=what, context=context)
        check_user_fields(plaintext, what=what, allow_insecure=policy.allow_insecure_tls)
        path = _stage(plaintext, tmpdir)
        try:
            yield path
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    finally:
        forget_secret(plaintext)
