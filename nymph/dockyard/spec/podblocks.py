"""Blocks of the infra schema that the sandbox pool and the GPU fleets share: pod hardening
(:class:`SecuritySpec`), the sandbox's network isolation, disruption budgets and pod resources
(re-exported by :mod:`nymph.dockyard.spec.schema`, the schema's one entry point)."""

from __future__ import annotations

import ipaddress
from typing import ClassVar, Literal

from pydantic import Field

from nymph.dockyard.spec import names
from nymph.dockyard.spec.fieldtypes import Block, IntOrStr, Problems, Qty, StrMap, StrTuple


class SecuritySpec(Block):
    """Pod / container hardening. ``runAsNonRoot`` and ``readOnlyRootFilesystem`` are
    opt-in (``null`` leaves them unset): they break many images."""

    enabled: bool = True
    runAsNonRoot: bool | None = None
    runAsUser: int | None = None
    runAsGroup: int | None = None
    fsGroup: int | None = None
    readOnlyRootFilesystem: bool | None = None
    allowPrivilegeEscalation: bool = False
    dropCapabilities: StrTuple = ("ALL",)
    addCapabilities: StrTuple = ()
    seccompProfile: Literal["RuntimeDefault", "Unconfined"] | None = "RuntimeDefault"


class NetworkPolicySpec(Block):
    """Sandbox isolation: ingress only on the executor port from this namespace (or from
    pods with ``fromLabels``); egress open unless ``allowEgress: false``, then only to
    ``allowedEgressCidrs``; DNS is always allowed."""

    enabled: bool = True
    allowEgress: bool = True
    allowedEgressCidrs: StrTuple = ()
    fromLabels: StrMap = Field(default_factory=dict)

    def problems(self) -> Problems:
        out: Problems = []
        for i, cidr in enumerate(self.allowedEgressCidrs):
            try:
                if "/" not in cidr:
                    raise ValueError(cidr)
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                out.append((f"allowedEgressCidrs[{i}]", f"{cidr!r} is not a CIDR (10.0.0.0/8)"))
        return out + names.label_map(self.fromLabels, key="fromLabels")


class PDBSpec(Block):
    enabled: bool = False
    minAvailable: IntOrStr | None = None
    maxUnavailable: IntOrStr | None = None

    #: Setting one of these in a partial block drops the default of the other.
    exclusive: ClassVar[tuple[str, ...]] = ("minAvailable", "maxUnavailable")

    def problems(self) -> Problems:
        if self.enabled and (self.minAvailable is None) == (self.maxUnavailable is None):
            return [("", "exactly one of minAvailable / maxUnavailable must be set when enabled")]
        return []


class PodResources(Block):
    """Requests (``cpu``, ``memory``, ``ephemeralStorage``) and limits (``*Limit``), each
    limit defaulting to its request."""

    cpu: Qty | None = None
    memory: Qty | None = None
    gpu: int | None = None
    ephemeralStorage: Qty | None = None
    cpuLimit: Qty | None = None
    memoryLimit: Qty | None = None
    ephemeralStorageLimit: Qty | None = None
