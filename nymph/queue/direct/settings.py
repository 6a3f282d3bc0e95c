"""The operator's settings for direct dispatch and the secret store (plain data)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nymph.kube.credentials import CredentialPolicy


@dataclass(frozen=True)
class DirectSettings:
    #: Directories path kubeconfigs may be read from (symlinks resolved); none: paths refused.
    kubeconfig_dirs: tuple[Path, ...] = ()
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
    #: Where kubeconfigs are staged during a call (None: the system temp dir).
    tmp_root: str | None = None

    @property
    def policy(self) -> CredentialPolicy:
        return CredentialPolicy(kubeconfig_dirs=tuple(self.kubeconfig_dirs), ambient=self.ambient)
