"""The operator's settings for direct dispatch and the secret store (plain data)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from nymph.kube.credentials import CredentialPolicy
from nymph.kube.netguard import ServerPolicy


@dataclass(frozen=True)
class DirectSettings:
    #: Directories path kubeconfigs may be read from (symlinks resolved) for tokens not scoped to
    #: a namespace (``--kubeconfig-dir DIR``); none: paths refused to them.
    kubeconfig_dirs: tuple[Path, ...] = ()
    #: ``(NS, DIR)``: DIR serves control-plane namespace NS only (``--kubeconfig-dir NS=DIR``).
    team_kubeconfig_dirs: tuple[tuple[str, Path], ...] = ()
    #: Where a user-supplied (inline or ``$secret``) kubeconfig may connect: hosts, IP addresses
    #: and CIDRs (``--kube-server-allow``); empty: anything but loopback, link-local,
    #: unspecified, metadata and the queue host's own addresses.
    kube_server_allow: tuple[str, ...] = ()
    #: A user-supplied kubeconfig may say ``insecure-skip-tls-verify`` (``--allow-insecure-tls``).
    allow_insecure_tls: bool = False
    #: Let a provider without a kubeconfig use the queue host's own credentials.
    ambient: bool = False
    #: The secret store's key; None: a file beside the database, created on first use.
    secret_key_file: Path | None = None
    #: Finished direct Pods are deleted this long after they end (their log tail is kept).
    reap_after: float = 600.0
    #: A connection's watch stops after this long without a live direct instance.
    watch_idle: float = 30.0
    #: How often the watch set and the reaper are looked at.
    interval: float = 2.0
    log_limit_bytes: int = 256 * 1024
    #: A ``$secret`` kubeconfig read for a call is used again for this long before the store is
    #: read again: a change made through another replica takes effect within it (through this
    #: one, at once); 0: read at every call.
    secret_reread: float = 2.0
    #: Where kubeconfigs are staged during a call (None: the system temp dir).
    tmp_root: str | None = None

    @functools.cached_property
    def policy(self) -> CredentialPolicy:
        """What a kubeconfig ref may reach (built once per settings object)."""
        return CredentialPolicy(
            kubeconfig_dirs=tuple(self.kubeconfig_dirs),
            team_dirs=tuple(self.team_kubeconfig_dirs),
            ambient=self.ambient,
            servers=ServerPolicy.from_allow(self.kube_server_allow),
            allow_insecure_tls=self.allow_insecure_tls,
        )
