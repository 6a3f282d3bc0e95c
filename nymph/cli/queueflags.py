"""The flags of ``nymph queue serve`` that take structured values, parsed into settings:
sizes (``8MiB``), namespace maps (``NS=A,B``), Pod request ceilings, the tenancy settings and
the kubeconfig directories. Each bad value is a ConfigError showing the expected form."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import TYPE_CHECKING

from nymph.errors import ConfigError

if TYPE_CHECKING:
    from nymph.queue.models import TenancySettings

_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
#: a resource name: ``cpu``, ``memory``, ``ephemeral-storage``, ``nvidia.com/gpu``
_RESOURCE = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[a-zA-Z0-9]([-a-zA-Z0-9_.]*[a-zA-Z0-9])?$")
_UNITS = {"": 1, "K": 1024, "KI": 1024, "M": 1024**2, "MI": 1024**2, "G": 1024**3, "GI": 1024**3}


def _size(text: str, flag: str) -> int:
    """``8MiB``, ``512K``, ``1048576``: a byte count (binary units)."""
    t = text.strip().upper().removesuffix("B")
    digits = t.rstrip("KMGI")
    unit = t[len(digits) :]
    if not digits.isdigit() or unit not in _UNITS:
        raise ConfigError(f"{flag} {text!r}: expected a size such as 8MiB, 512KiB or 1048576")
    value = int(digits) * _UNITS[unit]
    if value < 1024:
        raise ConfigError(f"{flag} {text!r}: at least 1KiB")
    return value


def _ns_map(specs: list[str], flag: str, *, many: bool) -> dict[str, tuple[str, ...]]:
    """``NS=A,B`` (``many``) or ``NS=A`` pairs, repeatable: NS -> (A, B, ...), each a DNS-1123 label."""
    out: dict[str, tuple[str, ...]] = {}
    for spec in specs:
        ns, sep, rest = spec.partition("=")
        values = [v.strip() for v in rest.split(",")] if many else [rest.strip()]
        if not sep or not _LABEL.match(ns) or not all(_LABEL.match(v) or _SUBDOMAIN.match(v) for v in values):
            example = "team-a=team-a,team-a-gpu" if many else "team-a=trainer"
            raise ConfigError(
                f"{flag} {spec!r}: expected NS={'K1,K2' if many else 'NAME'}, e.g. {flag} {example}"
            )
        out[ns] = tuple(dict.fromkeys(out.get(ns, ()) + tuple(values)))
    return out


def _pod_requests(specs: list[str]) -> dict[str, str]:
    """``--max-pod-request RESOURCE=QUANTITY`` values (repeatable): resource -> quantity."""
    from nymph.launch.placement import QuantityError, parse_quantity

    out: dict[str, str] = {}
    for spec in specs:
        resource, sep, quantity = (part.strip() for part in spec.partition("="))
        try:
            ok = bool(sep) and _RESOURCE.match(resource) is not None and parse_quantity(quantity) > 0
        except QuantityError:
            ok = False
        if not ok:
            raise ConfigError(
                f"--max-pod-request {spec!r}: expected RESOURCE=QUANTITY, e.g. cpu=64, memory=512Gi "
                "or nvidia.com/gpu=8"
            )
        out[resource] = quantity
    return out


def tenancy_settings(args: argparse.Namespace) -> TenancySettings:
    from nymph.queue.models import TenancySettings

    if args.max_replicas < 1:
        raise ConfigError(f"--max-replicas {args.max_replicas}: at least 1")
    return TenancySettings(
        kube_namespaces=_ns_map(args.kube_namespaces, "--kube-namespaces", many=True),
        service_accounts=_ns_map(args.service_account, "--service-account", many=False),
        max_replicas=args.max_replicas,
        max_pod_requests=_pod_requests(args.max_pod_request),
    )


def kubeconfig_dirs(values: list[str]) -> tuple[tuple[Path, ...], tuple[tuple[str, Path], ...]]:
    """``--kubeconfig-dir`` values: ``DIR`` (bare: for tokens not scoped to a namespace) or
    ``NS=DIR`` (for control-plane namespace NS only). A value starting with ``/``, ``.`` or
    ``~`` is a directory whatever it holds."""
    bare: list[Path] = []
    team: list[tuple[str, Path]] = []
    for value in values:
        ns, sep, directory = value.partition("=")
        if not sep or value.startswith(("/", ".", "~")):
            bare.append(Path(value).expanduser())
            continue
        if not ns or not directory:
            raise ConfigError(f"--kubeconfig-dir {value}: expected DIR or NS=DIR")
        team.append((ns, Path(directory).expanduser()))
    return tuple(bare), tuple(team)
