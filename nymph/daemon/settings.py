"""Daemon settings: small grouped dataclasses under one root, passed in explicitly.

Sources, low to high: defaults, a YAML config file (``--config``), environment
(``NYMPH_*``, and ``NODE_NAME`` from the downward API), command-line flags.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from nymph.errors import ConfigError


@dataclass(frozen=True)
class DaemonQueueSettings:
    url: str = "http://127.0.0.1:8700"
    token: str = field(default="", repr=False)
    #: Long-poll hold, seconds: a claim the queue answers early when work comes, so the hold
    #: only sets how often an idle daemon asks again (1,000 idle daemons at 30 s cost the queue
    #: 6% of a core, at 50 s 3.6%); under the 60 s idle timeout of common proxies and load
    #: balancers, and the queue's own most (60 s).
    poll_wait: float = 50.0
    lease_seconds: int = 60


@dataclass(frozen=True)
class KubeSettings:
    kubeconfig: str | None = None
    context: str | None = None
    namespaces: tuple[str, ...] = ("default",)
    apply_with: str = "kubectl"  # kubectl | api
    delete_grace_seconds: int | None = None  # None: the Pod's own terminationGracePeriodSeconds


@dataclass(frozen=True)
class WorkSettings:
    root: Path = Path("/var/lib/nymph")
    dir_mode: int = 0o775
    owner: tuple[int, int] | None = None  # chown workdirs to uid:gid (e.g. the Pods' runAsUser)
    reap_after_seconds: float = 600.0  # finished Pods and workdirs are removed this long after they end
    log_limit_bytes: int = 256 * 1024


#: Default tasks in flight with ``--apply-with api`` (concurrent creates).
API_CONCURRENCY = 8
#: Default kubectl runs in flight with ``--apply-with kubectl`` (each of up to ``batch_max``).
KUBECTL_RUNS = 2


@dataclass(frozen=True)
class DaemonSettings:
    daemon_id: str = ""
    node: str | None = None
    #: Most tasks in flight at once; 0: the apply path's default (8 with api; with kubectl, two
    #: runs of ``batch_max`` and at least 8: a run costs about the same for one Pod as for a
    #: full batch).
    concurrency: int = 0
    #: Most launches per kubectl run. A run's CPU is mostly kubectl starting (about 70 ms), so
    #: under load a larger batch costs less per Pod (about 5 ms each in a run of 16, 2 in one
    #: of 64); at low load a batch is what is there, and a lone launch starts at once.
    batch_max: int = 64
    listen: str = "127.0.0.1:9700"
    shutdown_grace_seconds: float = 20.0
    healthz_stale_polls: int = 3
    outbox_memory_max: int = 1000
    #: How long the outbox lets a send wait for more reports, completions and log chunks to join
    #: it (seconds): each reaches the queue up to that much later, and a busy daemon sends them
    #: in a few requests instead of one or two per launch.
    outbox_linger: float = 0.02
    #: Under load, how often at most the outbox starts a send of one kind (seconds): reports
    #: with completions, and log chunks, each go at most once per ``outbox_pace`` however many
    #: launches a second the daemon runs, so each reaches the queue up to that much later under
    #: load. Every request costs the daemon and the queue more CPU than the items it carries.
    outbox_pace: float = 0.25
    queue: DaemonQueueSettings = field(default_factory=DaemonQueueSettings)
    kube: KubeSettings = field(default_factory=KubeSettings)
    work: WorkSettings = field(default_factory=WorkSettings)

    @property
    def in_flight(self) -> int:
        """Most tasks in flight at once: ``concurrency``, or the apply path's default."""
        if self.concurrency > 0:
            return self.concurrency
        if self.kube.apply_with == "api":
            return API_CONCURRENCY
        return max(API_CONCURRENCY, KUBECTL_RUNS * self.batch_max)

    @property
    def state_dir(self) -> Path:
        return self.work.root / "state"

    @property
    def audit_path(self) -> Path:
        return self.work.root / "audit.jsonl"

    def check(self) -> DaemonSettings:
        if self.kube.apply_with not in ("kubectl", "api"):
            raise ConfigError(f"--apply-with {self.kube.apply_with!r}: use kubectl or api")
        if self.concurrency < 0:
            raise ConfigError("--concurrency must be at least 1 (or 0: the apply path's default)")
        if self.batch_max < 1:
            raise ConfigError("--batch-max must be at least 1")
        for name, zero in (("outbox_linger", "send at once"), ("outbox_pace", "no pace")):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 5:
                raise ConfigError(f"{name} {value!r}: use 0 to 5 seconds (0: {zero})")
        if self.concurrency == 0:
            return replace(self, concurrency=self.in_flight).check()
        if not self.queue.token:
            raise ConfigError(
                "no queue token: pass --token or set NYMPH_TOKEN (create one with `nymph queue token create --role daemon`)"
            )
        if not str(self.work.root).startswith("/"):
            raise ConfigError(f"--workdir-root {self.work.root}: must be an absolute path")
        if not self.kube.namespaces:
            raise ConfigError("serve at least one namespace (--namespace NS)")
        return self


def _merge(obj: Any, data: dict[str, Any], where: str) -> Any:
    known = {f.name: f for f in fields(obj)}
    updates: dict[str, Any] = {}
    for key, value in data.items():
        k = key.replace("-", "_")
        if k not in known:
            raise ConfigError(f"{where}: unknown setting {key!r} (known: {', '.join(sorted(known))})")
        current = getattr(obj, k)
        if hasattr(current, "__dataclass_fields__") and isinstance(value, dict):
            updates[k] = _merge(current, value, f"{where}.{key}")
        elif isinstance(current, tuple) and isinstance(value, list):
            updates[k] = tuple(value)
        elif isinstance(current, Path):
            updates[k] = Path(value)
        else:
            updates[k] = value
    return replace(obj, **updates)


def load_settings(
    *, config_file: str | None, environ: dict[str, str] | None = None, **flags: Any
) -> DaemonSettings:
    env = os.environ if environ is None else environ
    s = DaemonSettings()
    if config_file:
        try:
            data = yaml.safe_load(Path(config_file).read_text()) or {}
        except FileNotFoundError:
            raise ConfigError(f"--config {config_file}: no such file") from None
        except yaml.YAMLError:
            raise ConfigError(f"--config {config_file}: not valid YAML") from None
        if not isinstance(data, dict):
            raise ConfigError(f"--config {config_file}: expected a mapping")
        s = _merge(s, data, config_file)
    q, k, w = s.queue, s.kube, s.work
    # environment
    q = replace(q, url=env.get("NYMPH_URL", q.url), token=env.get("NYMPH_TOKEN", q.token))
    if env.get("NYMPH_NAMESPACES"):
        k = replace(k, namespaces=tuple(n.strip() for n in env["NYMPH_NAMESPACES"].split(",") if n.strip()))
    if env.get("NYMPH_WORKDIR_ROOT"):
        w = replace(w, root=Path(env["NYMPH_WORKDIR_ROOT"]))
    node = env.get("NODE_NAME") or s.node
    # flags
    if flags.get("queue"):
        q = replace(q, url=flags["queue"])
    if flags.get("token"):
        q = replace(q, token=flags["token"])
    if flags.get("poll_wait") is not None:
        q = replace(q, poll_wait=float(flags["poll_wait"]))
    if flags.get("lease_seconds") is not None:
        q = replace(q, lease_seconds=int(flags["lease_seconds"]))
    if flags.get("namespaces"):
        k = replace(k, namespaces=tuple(flags["namespaces"]))
    if flags.get("kubeconfig"):
        k = replace(k, kubeconfig=flags["kubeconfig"])
    if flags.get("context"):
        k = replace(k, context=flags["context"])
    if flags.get("apply_with"):
        k = replace(k, apply_with=flags["apply_with"])
    if flags.get("workdir_root"):
        w = replace(w, root=Path(flags["workdir_root"]))
    if flags.get("reap_after") is not None:
        w = replace(w, reap_after_seconds=float(flags["reap_after"]))
    if flags.get("node"):
        node = flags["node"]
    top: dict[str, Any] = {"queue": q, "kube": k, "work": w, "node": node}
    for name in ("concurrency", "listen", "daemon_id", "shutdown_grace_seconds", "batch_max"):
        if flags.get(name) is not None:
            top[name] = flags[name]
    s = replace(s, **top)
    if not s.daemon_id:
        s = replace(s, daemon_id=f"{s.node or os.uname().nodename}-{os.getpid()}")
    return s.check()
