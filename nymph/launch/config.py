"""Providers and modes: the configuration a launch is made from (pure).

A *provider* says where Pods go (the connection: ``kubeconfig``, ``context``, ``namespace``).
A *mode* says what the Pod looks like (``image``, ``resources``, ``env``, ...). Either may carry
the other's keys: kwargs merge provider first, then mode (the mode wins per key). A ``name`` key
is ignored wherever it appears (with a debug log). Both come from a ``.dreamrc`` YAML file or from
the CLI verbs ``providers add`` / ``modes add`` (``--field provider=P`` names the provider)::

    providers:
      my-cluster: !providers.Kube
        context: prod-east
        namespace: lakeshore
    modes:
      k8s-gpu:
        provider: my-cluster
        image: ghcr.io/acme/train:1.4
        resources: {limits: {nvidia.com/gpu: "1"}}
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nymph.errors import ConfigError, ValidationError
from nymph.launch.runlimits import check_settings

LAUNCHER = "Kube"
PROVIDER_TAG_PREFIX = "!providers."

log = logging.getLogger(__name__)

#: Connection kwargs (usually on the provider). ``name`` is accepted and ignored.
PROVIDER_KWARGS = frozenset({"kubeconfig", "context", "namespace"})
IGNORED_PROVIDER_KWARGS = frozenset({"name"})
#: Pod-shape kwargs (usually on the mode).
MODE_FIELDS = frozenset(
    {
        "image",
        "resources",
        "env",
        "node_selector",
        "tolerations",
        "service_account",
        "image_pull_secrets",
        "priority",
        "max_runtime",
        "image_pull_timeout",
        "retry",
    }
)
#: Every kwarg a provider or a mode may carry (either may sit on the other).
KUBE_KWARGS = PROVIDER_KWARGS | MODE_FIELDS
DISPATCH_DIRECT = "direct"
DISPATCH_DAEMON = "daemon"
DISPATCH_VALUES = frozenset({DISPATCH_DIRECT, DISPATCH_DAEMON})
#: The dispatch of a provider that names none.
DEFAULT_DISPATCH = DISPATCH_DIRECT
#: Kwargs that mean nothing on a ``dispatch: daemon`` provider (the daemon uses its own identity).
DIRECT_ONLY_KWARGS = ("kubeconfig", "context")


def _drop_ignored(kwargs: Mapping[str, Any], *, where: str) -> dict[str, Any]:
    """``kwargs`` without the keys this launcher never reads (``name``), logged at debug."""
    out = dict(kwargs)
    for key in IGNORED_PROVIDER_KWARGS & set(out):
        log.debug("%s: kwarg %r is not read by the Kube launcher; ignored", where, key)
        del out[key]
    return out


def _check_settings(kwargs: Mapping[str, Any], *, where: str, name: str) -> None:
    """``priority`` and ``max_runtime`` are checked when a mode or provider is made, not first
    at its first launch (see :mod:`nymph.launch.runlimits`)."""
    try:
        check_settings(kwargs, where=where)
    except ValidationError as exc:
        raise ConfigError(f"{where} {name!r}: {exc}") from None


def check_launcher(launcher: object) -> str:
    """The launcher must be exactly ``Kube``; every other spelling is refused."""
    if launcher != LAUNCHER:
        raise ConfigError(
            f"launcher {launcher!r} is not supported: the only launcher is {LAUNCHER!r} "
            "(spelled exactly so; 'k8s', 'kube' and 'local' are not accepted)"
        )
    return LAUNCHER


@dataclass(frozen=True)
class Provider:
    """A named Kube provider: connection kwargs plus how launches reach the cluster."""

    name: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    launcher: str = LAUNCHER
    dispatch: str = DEFAULT_DISPATCH

    def __post_init__(self) -> None:
        check_launcher(self.launcher)
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigError("a provider needs a non-empty name")
        if self.dispatch not in DISPATCH_VALUES:
            raise ConfigError(
                f"provider {self.name!r}: dispatch {self.dispatch!r} is not supported; use "
                f"'{DISPATCH_DIRECT}' (the queue creates the Pod) or '{DISPATCH_DAEMON}' (a "
                "daemon in the cluster does)"
            )
        unknown = sorted(set(self.kwargs) - KUBE_KWARGS - IGNORED_PROVIDER_KWARGS)
        if unknown:
            raise ConfigError(
                f"provider {self.name!r}: unknown kwarg(s) {', '.join(unknown)}; a Kube provider "
                f"takes {', '.join(sorted(PROVIDER_KWARGS))} and the Pod-shape kwargs "
                f"{', '.join(sorted(MODE_FIELDS))}"
            )
        _check_settings(self.kwargs, where="provider", name=self.name)
        object.__setattr__(self, "kwargs", _drop_ignored(self.kwargs, where=f"provider {self.name!r}"))

    @property
    def direct(self) -> bool:
        return self.dispatch == DISPATCH_DIRECT

    @property
    def namespace(self) -> str:
        ns = self.kwargs.get("namespace")
        return ns if isinstance(ns, str) and ns else "default"

    def to_json(self) -> dict[str, Any]:
        kwargs = dict(self.kwargs)
        return {
            "name": self.name,
            "launcher": self.launcher,
            "dispatch": self.dispatch,
            "kwargs": kwargs,
        }


@dataclass(frozen=True)
class Mode:
    """A named Pod shape bound to a provider."""

    name: str
    provider: str | None = None
    fields: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigError("a mode needs a non-empty name")
        unknown = sorted(set(self.fields) - KUBE_KWARGS - IGNORED_PROVIDER_KWARGS)
        if unknown:
            raise ConfigError(
                f"mode {self.name!r}: unknown field(s) {', '.join(unknown)}; a mode takes "
                f"{', '.join(sorted(MODE_FIELDS))} and the connection kwargs "
                f"{', '.join(sorted(PROVIDER_KWARGS))}"
            )
        _check_settings(self.fields, where="mode", name=self.name)
        object.__setattr__(self, "fields", _drop_ignored(self.fields, where=f"mode {self.name!r}"))

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "provider": self.provider, "fields": dict(self.fields)}


def merged_kwargs(provider: Provider, mode: Mode) -> dict[str, Any]:
    """Provider kwargs, then mode fields over them (the mode wins per key)."""
    return {**provider.kwargs, **mode.fields}


def connection_kwargs(provider: Provider, mode: Mode) -> dict[str, Any]:
    """The connection a launch of ``mode`` on ``provider`` uses (``kubeconfig``, ``context``,
    ``namespace``; absent keys left out). A launch body never changes it."""
    merged = merged_kwargs(provider, mode)
    return {k: merged[k] for k in sorted(PROVIDER_KWARGS) if merged.get(k) not in (None, "")}


def check_dispatch_kwargs(provider: Provider, mode: Mode | None = None) -> None:
    """On a ``dispatch: daemon`` provider, ``kubeconfig`` and ``context`` mean nothing: refuse
    them (on the provider, or on a mode bound to it) instead of ignoring them."""
    if provider.direct:
        return
    for where, kwargs in (
        (f"provider {provider.name!r}", provider.kwargs),
        (f"mode {mode.name!r}" if mode else "", mode.fields if mode else {}),
    ):
        given = [k for k in DIRECT_ONLY_KWARGS if kwargs.get(k) not in (None, "")]
        if given:
            raise ConfigError(
                f"{where}: {' and '.join(given)} {'mean' if len(given) > 1 else 'means'} nothing "
                "on a 'dispatch: daemon' provider "
                "(the daemon in the cluster uses its own identity): remove them, or use "
                "'dispatch: direct' to have the queue create the Pod with that connection"
            )
